#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>
#include <numeric>
#include <unordered_set>

#include "ckptfs/error.hpp"
#include "views/extent_builder.hpp"

namespace ckptfs::views {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's limit

void put_u64_le(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

}  // namespace

VirtualFilePtr make_safetensors(std::shared_ptr<const catalog::Catalog> catalog) {
  std::vector<size_t> all(catalog->tensors.size());
  std::iota(all.begin(), all.end(), 0);
  return make_safetensors(std::move(catalog), all);
}

VirtualFilePtr make_safetensors(std::shared_ptr<const catalog::Catalog> catalog,
                                std::span<const size_t> subset) {
  const auto& tensors = catalog->tensors;
  // The order safetensors' own writer (save_file, so zero_to_fp32 --safe_serialization and
  // save_pretrained) uses: its dtype enum descending (widest first, so every tensor is naturally aligned),
  // then names bytewise. The view is then byte for byte what that writer makes of the same tensors, and
  // loaders, which take keys() in name order, read it front to back.
  std::vector<size_t> order(subset.begin(), subset.end());
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int rank_a = dtype_safetensors_rank(tensors[a].dtype),
              rank_b = dtype_safetensors_rank(tensors[b].dtype);
    return rank_a != rank_b ? rank_a > rank_b : tensors[a].name < tensors[b].name;
  });

  // The header is written as text in one pass (a JSON object built key by key is quadratic in the
  // number of tensors); the layout is what nlohmann::json::dump() gives for the same object.
  std::string json = R"({"__metadata__":{"format":"pt"})";
  std::unordered_set<std::string_view> names;
  uint64_t data_offset = 0;
  for (size_t i : order) {
    const auto& t = tensors[i];
    if (!names.insert(t.name).second || t.name == "__metadata__")
      throw FormatError(fmt::format("safetensors view: tensor name {} appears twice", t.name));
    try {
      json += ',' + nlohmann::json(t.name).dump();  // escaped; invalid UTF-8 throws
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(fmt::format("safetensors view: cannot write the header: {}", e.what()));
    }
    fmt::format_to(std::back_inserter(json), R"(:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})",
                   dtype_safetensors_name(t.dtype), fmt::join(t.shape, ","), data_offset,
                   data_offset + t.nbytes());
    data_offset += t.nbytes();
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kMaxHeaderBytes)
    throw UnsupportedError(fmt::format("safetensors view: header of {} bytes exceeds the {} byte limit",
                                       json.size(), kMaxHeaderBytes));

  ExtentBuilder out;
  std::string prefix;
  put_u64_le(prefix, json.size());
  out.append(prefix);
  out.append(json);
  for (size_t i : order) out.append({catalog, i});
  return std::make_shared<ExtentFile>(std::move(out).finish());
}

}  // namespace ckptfs::views
