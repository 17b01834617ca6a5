#include "formats/plain/safetensors_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "ckptfs/error.hpp"

namespace ckptfs::plain {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's limit

std::optional<DType> dtype_of(std::string_view name) {
  for (DType d : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::F8_E5M2, DType::F8_E4M3FN,
                  DType::F8_E5M2FNUZ, DType::F8_E4M3FNUZ, DType::I64, DType::I32, DType::I16, DType::I8,
                  DType::U8, DType::U16, DType::U32, DType::U64, DType::Bool})
    if (dtype_safetensors_name(d) == name) return d;
  return std::nullopt;
}

}  // namespace

SafetensorsHeader read_safetensors_header(const io::FilePtr& file) {
  return read_safetensors_blob(io::FileRange(file));
}

std::vector<SafetensorsEntry> read_safetensors(const io::FilePtr& file) {
  return read_safetensors_header(file).tensors;
}

SafetensorsHeader read_safetensors_blob(const io::FileRange& range) {
  const io::FilePtr& file = range.file();
  const auto fail = [&](const std::string& what) {
    throw FormatError(fmt::format("{}: not a valid safetensors {}: {}", file->path().string(),
                                  range.base() == 0 ? "file" : fmt::format("blob at byte {}", range.base()),
                                  what));
  };
  if (range.size() < 8) fail("shorter than the 8-byte header length");
  const auto len_bytes = range.read(0, 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<uint64_t>(len_bytes[i]);
  if (header_len > kMaxHeaderBytes || header_len > range.size() - 8)
    fail(fmt::format("header length {} exceeds the file or the 100 MB limit", header_len));
  const auto header_bytes = range.read(8, header_len);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(header_bytes.data()),
                                   reinterpret_cast<const char*>(header_bytes.data()) + header_bytes.size());
  } catch (const nlohmann::json::exception& e) {
    fail(fmt::format("header is not JSON: {}", e.what()));
  }
  if (!header.is_object()) fail("header is not a JSON object");
  const uint64_t data_start = 8 + header_len, data_size = range.size() - data_start;
  std::vector<std::pair<uint64_t, SafetensorsEntry>> found;
  SafetensorsHeader out;
  try {
    for (const auto& [name, info] : header.items()) {
      if (name == "__metadata__") {
        if (!info.is_object()) fail("__metadata__ is not an object");
        for (const auto& [key, value] : info.items()) {
          if (!value.is_string()) fail(fmt::format("__metadata__ value {} is not a string", key));
          out.metadata[key] = value.get<std::string>();
        }
        continue;
      }
      const auto dtype = dtype_of(info.at("dtype").get<std::string>());
      if (!dtype) fail(fmt::format("tensor {} has dtype {}", name, info.at("dtype").dump()));
      SafetensorsEntry e{name, {}};
      e.tensor.dtype = *dtype;
      e.tensor.shape = info.at("shape").get<std::vector<int64_t>>();
      const auto offsets = info.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size)
        fail(fmt::format("tensor {} has data_offsets outside the data section", name));
      uint64_t numel = 1;
      for (int64_t d : e.tensor.shape) {
        if (d < 0 || (d != 0 && numel > (UINT64_MAX >> 4) / static_cast<uint64_t>(d)))
          fail(fmt::format("tensor {} has a bad shape", name));
        numel *= static_cast<uint64_t>(d);
      }
      if (numel * dtype_size(*dtype) != offsets[1] - offsets[0])
        fail(fmt::format("tensor {} holds {} bytes for {} elements", name, offsets[1] - offsets[0], numel));
      e.tensor.strides.assign(e.tensor.shape.size(), 1);
      for (size_t d = e.tensor.shape.size(); d-- > 1;)
        e.tensor.strides[d - 1] = e.tensor.strides[d] * std::max<int64_t>(e.tensor.shape[d], 1);
      e.tensor.storage = {
          .file = file, .offset = range.base() + data_start + offsets[0], .nbytes = offsets[1] - offsets[0]};
      found.emplace_back(offsets[0], std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    fail(fmt::format("header entry: {}", e.what()));
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [offset, e] : found) out.tensors.push_back(std::move(e));
  return out;
}

}  // namespace ckptfs::plain
