#include "views/gguf/verbatim_rows.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace ckptfs::views::gguf {

namespace {

bool same_encoding(DType source, GgmlType out) {
  return (source == DType::F32 && out == GgmlType::f32) || (source == DType::F16 && out == GgmlType::f16) ||
         (source == DType::BF16 && out == GgmlType::bf16);
}

// gguf-py's bf16 of a float32 widened from a BF16 NaN sets the quiet bit (0x0040, in the low byte on this
// little-endian layout); every other value comes back as it was.
void quiet_bf16_nan(std::byte& low, std::byte high) {
  const auto v = static_cast<uint16_t>(std::to_integer<uint16_t>(high) << 8 | std::to_integer<uint16_t>(low));
  if ((v & 0x7fff) > 0x7f80) low |= std::byte{0x40};
}

// The source's bytes for [offset, offset + dst.size()) of the data.
void read_rows(const GgufTensor& t, const SourceRows& rows, uint64_t offset, std::span<std::byte> dst) {
  const catalog::LogicalTensor& source = *rows.tensor;
  if (rows.permute_heads == 0) return catalog::read_tensor(source, offset, dst);
  const uint64_t row_bytes = (t.ne.size() > 1 ? t.ne[0] : 1) * dtype_size(source.dtype);
  const uint64_t n_rows = t.nbytes() / row_bytes;
  for (uint64_t done = 0; done < dst.size();) {
    const uint64_t at = offset + done, row = at / row_bytes, in_row = at % row_bytes;
    const uint64_t n = std::min(dst.size() - done, row_bytes - in_row);
    catalog::read_tensor(source, permuted_source_row(row, n_rows, rows.permute_heads) * row_bytes + in_row,
                         dst.subspan(done, n));
    done += n;
  }
}

}  // namespace

uint64_t permuted_source_row(uint64_t row, uint64_t rows, uint64_t heads) {
  const uint64_t head_rows = rows / heads, half = head_rows / 2, in_head = row % head_rows;
  return row - in_head + (in_head % 2) * half + in_head / 2;
}

const SourceRows* verbatim_rows(const GgufTensor& t) {
  return std::visit(
      [&](const auto& e) -> const SourceRows* {
        if constexpr (std::is_same_v<std::decay_t<decltype(e)>, SourceRows>)
          return same_encoding(e.tensor->dtype, t.type) ? &e : nullptr;
        else
          return nullptr;
      },
      t.elements);
}

void read_verbatim(const GgufTensor& t, const SourceRows& rows, uint64_t offset, std::span<std::byte> dst) {
  read_rows(t, rows, offset, dst);
  if (rows.tensor->dtype != DType::BF16) return;
  // A read that starts on an element's high byte leaves it as it is; one that ends on a low byte needs the
  // high byte after it.
  size_t i = offset % 2;
  for (; i + 1 < dst.size(); i += 2) {  // (an unconditional store: the loop vectorizes)
    uint16_t v;
    std::memcpy(&v, dst.data() + i, 2);
    v |= (v & 0x7fff) > 0x7f80 ? 0x0040 : 0;
    std::memcpy(dst.data() + i, &v, 2);
  }
  if (i < dst.size()) {
    std::byte high;
    read_rows(t, rows, offset + dst.size(), std::span(&high, 1));
    quiet_bf16_nan(dst[i], high);
  }
}

}  // namespace ckptfs::views::gguf
