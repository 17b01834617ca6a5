#include "views/gguf/gguf_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "catalog/dtype_convert.hpp"
#include "ckptfs/error.hpp"
#include "views/gguf/gguf_kv.hpp"
#include "views/gguf/gguf_numbers.hpp"
#include "views/gguf/verbatim_rows.hpp"

namespace ckptfs::views::gguf {

namespace {

constexpr uint64_t pad(uint64_t n) {
  return (n + kAlignment - 1) / kAlignment * kAlignment;
}

// Elements converted per step of a read: bounds the scratch memory of a server thread.
constexpr uint64_t kStepElements = uint64_t{1} << 16;

uint64_t type_bytes(GgmlType type, uint64_t elements) {
  switch (type) {
    case GgmlType::f32:
      return elements * 4;
    case GgmlType::f16:
    case GgmlType::bf16:
      return elements * 2;
    case GgmlType::q8_0:
      return elements / kQ8Block * kQ8BlockBytes;
  }
  throw std::logic_error("unknown ggml type");
}

// Reads elements [first, first + count) of a tensor's source in its row order, widened to float32.
class ElementReader {
 public:
  explicit ElementReader(const GgufTensor& t) : t_(t) {}

  void read(uint64_t first, uint64_t count, float* out) const {
    std::visit([&](const auto& e) { read_from(e, first, count, out); }, t_.elements);
  }

 private:
  void read_from(const ComputedF32& c, uint64_t first, uint64_t count, float* out) const {
    std::copy_n(c.values.begin() + static_cast<ptrdiff_t>(first), count, out);
  }

  void read_from(const StackedExperts& s, uint64_t first, uint64_t count, float* out) const {
    // a read may cross from one expert into the next; a Q8_0 block never does (rows are whole blocks)
    const uint64_t per_expert = t_.numel() / s.experts.size();
    while (count > 0) {
      const uint64_t expert = first / per_expert, at = first % per_expert;
      const uint64_t n = std::min(count, per_expert - at);
      read_flat(*s.experts[expert], at, n, out);
      first += n, count -= n, out += n;
    }
  }

  void read_from(const SourceRows& s, uint64_t first, uint64_t count, float* out) const {
    if (s.permute_heads == 0) return read_flat(*s.tensor, first, count, out);
    // Llama's Q/K permutation moves whole rows
    const uint64_t cols = t_.ne.size() > 1 ? t_.ne[0] : 1, rows = t_.numel() / cols;
    while (count > 0) {
      const uint64_t row = first / cols, col = first % cols, n = std::min(count, cols - col);
      read_flat(*s.tensor, permuted_source_row(row, rows, s.permute_heads) * cols + col, n, out);
      first += n, count -= n, out += n;
    }
  }

  static void read_flat(const catalog::LogicalTensor& tensor, uint64_t first, uint64_t count, float* out) {
    const uint64_t size = dtype_size(tensor.dtype);
    if (tensor.dtype == DType::F32)
      return catalog::read_tensor(tensor, first * 4,
                                  std::span<std::byte>(reinterpret_cast<std::byte*>(out), count * 4));
    thread_local std::vector<std::byte> narrow;
    narrow.resize(count * size);
    catalog::read_tensor(tensor, first * size, narrow);
    if (tensor.dtype == DType::F16) {  // the converter keeps F16 and widens it with numpy: NaNs not quieted
      for (uint64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, narrow.data() + 2 * i, 2);
        out[i] = std::bit_cast<float>(f16_to_f32(h));
      }
      return;
    }
    catalog::convert(tensor.dtype, DType::F32, narrow,
                     std::span<std::byte>(reinterpret_cast<std::byte*>(out), count * 4));
  }

  const GgufTensor& t_;
};

void put_u16(std::byte* out, uint16_t v) {
  out[0] = static_cast<std::byte>(v);
  out[1] = static_cast<std::byte>(v >> 8);
}

// Bytes [offset, offset + dst.size()) of tensor `t`'s data (without its padding).
void read_data(const GgufTensor& t, uint64_t offset, std::span<std::byte> dst) {
  if (const SourceRows* rows = verbatim_rows(t)) return read_verbatim(t, *rows, offset, dst);
  thread_local std::vector<float> values;
  thread_local std::vector<std::byte> encoded;
  const ElementReader reader(t);
  const uint64_t unit = t.type == GgmlType::q8_0 ? kQ8BlockBytes : type_bytes(t.type, 1);
  const uint64_t unit_elements = t.type == GgmlType::q8_0 ? kQ8Block : 1;
  uint64_t unit_index = offset / unit;
  const uint64_t skip = offset % unit;
  uint64_t done = 0;
  while (done < dst.size()) {
    const uint64_t from = done == 0 ? skip : 0;  // bytes of the first unit before the read (first step only)
    const uint64_t units =
        std::min(kStepElements / unit_elements, (from + dst.size() - done + unit - 1) / unit);
    values.resize(units * unit_elements);
    encoded.resize(units * unit);
    reader.read(unit_index * unit_elements, values.size(), values.data());
    for (uint64_t u = 0; u < units; ++u) {
      std::byte* out = encoded.data() + u * unit;
      const float* x = values.data() + u * unit_elements;
      switch (t.type) {
        case GgmlType::f32:
          std::memcpy(out, x, 4);
          break;
        case GgmlType::f16:
          put_u16(out, f32_to_f16(std::bit_cast<uint32_t>(*x)));
          break;
        case GgmlType::bf16:
          put_u16(out, f32_to_bf16(std::bit_cast<uint32_t>(*x)));
          break;
        case GgmlType::q8_0:
          quantize_q8_0_block(
              std::span<const float, kQ8Block>(x, kQ8Block),
              std::span<uint8_t, kQ8BlockBytes>(reinterpret_cast<uint8_t*>(out), kQ8BlockBytes));
          break;
      }
    }
    const uint64_t n = std::min<uint64_t>(encoded.size() - from, dst.size() - done);
    std::memcpy(dst.data() + done, encoded.data() + from, n);
    done += n;
    unit_index += units;
  }
}

class GgufFile final : public VirtualFile {
 public:
  // The bytes before the data: the header and the architecture's keys, the tokenizer's keys (shared by the
  // files of one model: megabytes for a large vocabulary), the tensor infos and padding.
  GgufFile(std::array<std::shared_ptr<const std::string>, 3> prefix, std::vector<GgufTensor> tensors)
      : prefix_(std::move(prefix)), tensors_(std::move(tensors)) {
    uint64_t offset = 0;
    for (const auto& part : prefix_) offset += part->size();
    for (const auto& t : tensors_) {
      starts_.push_back(offset);
      offset += pad(t.nbytes());
    }
    size_ = offset;
  }

  uint64_t size() const override { return size_; }

  void read(uint64_t offset, std::span<std::byte> dst) const override {
    if (offset > size_ || dst.size() > size_ - offset)
      throw std::out_of_range(
          fmt::format("read of {} bytes at {} past the end ({} bytes)", dst.size(), offset, size_));
    uint64_t part_start = 0;
    for (const auto& part : prefix_) {
      if (!dst.empty() && offset < part_start + part->size()) {
        const uint64_t n = std::min<uint64_t>(dst.size(), part_start + part->size() - offset);
        std::memcpy(dst.data(), part->data() + (offset - part_start), n);
        offset += n;
        dst = dst.subspan(n);
      }
      part_start += part->size();
    }
    if (dst.empty()) return;
    size_t i =
        static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - 1;
    for (; !dst.empty(); ++i) {
      const GgufTensor& t = tensors_[i];
      const uint64_t in = offset - starts_[i], nbytes = t.nbytes();
      const uint64_t n = std::min<uint64_t>(dst.size(), pad(nbytes) - in);
      const uint64_t data = in < nbytes ? std::min(n, nbytes - in) : 0;
      if (data > 0) read_data(t, in, dst.first(data));
      std::memset(dst.data() + data, 0, n - data);
      offset += n;
      dst = dst.subspan(n);
    }
  }

  std::vector<io::FilePtr> sources() const override {
    std::vector<catalog::TensorRef> refs = source_tensors();
    return distinct_sources(refs);
  }

  void append_source_runs(std::vector<catalog::Piece>& out) const override {
    for (const auto& ref : source_tensors()) catalog::append_runs(*ref, 0, ref->numel(), out);
  }

 private:
  // The source tensors the data is read from, in the file's order.
  std::vector<catalog::TensorRef> source_tensors() const {
    std::vector<catalog::TensorRef> refs;
    for (const auto& t : tensors_) {
      if (const auto* s = std::get_if<SourceRows>(&t.elements)) refs.push_back(s->tensor);
      if (const auto* s = std::get_if<StackedExperts>(&t.elements))
        refs.insert(refs.end(), s->experts.begin(), s->experts.end());
    }
    return refs;
  }

  std::array<std::shared_ptr<const std::string>, 3> prefix_;
  std::vector<GgufTensor> tensors_;
  std::vector<uint64_t> starts_;  // each tensor's data offset in the file
  uint64_t size_ = 0;
};

}  // namespace

uint64_t GgufTensor::numel() const {
  return std::accumulate(ne.begin(), ne.end(), uint64_t{1}, std::multiplies<>());
}

uint64_t GgufTensor::nbytes() const {
  return type_bytes(type, numel());
}

VirtualFilePtr make_gguf_file(const std::string& kv_section,
                              std::shared_ptr<const std::string> shared_kv_section, uint64_t kv_count,
                              std::vector<GgufTensor> tensors) {
  std::string head;
  put_u32(head, 0x46554747);  // "GGUF"
  put_u32(head, 3);
  put_u64(head, tensors.size());
  put_u64(head, kv_count);
  head += kv_section;
  std::string infos;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    put_string(infos, t.name);
    put_u32(infos, static_cast<uint32_t>(t.ne.size()));
    for (uint64_t n : t.ne) put_u64(infos, n);
    put_u32(infos, static_cast<uint32_t>(t.type));
    put_u64(infos, offset);
    offset += pad(t.nbytes());
  }
  const uint64_t before = head.size() + shared_kv_section->size() + infos.size();
  infos.resize(infos.size() + (pad(before) - before), '\0');
  return std::make_shared<GgufFile>(
      std::array<std::shared_ptr<const std::string>, 3>{
          std::make_shared<const std::string>(std::move(head)), std::move(shared_kv_section),
          std::make_shared<const std::string>(std::move(infos))},
      std::move(tensors));
}

}  // namespace ckptfs::views::gguf
