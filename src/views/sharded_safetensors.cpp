// The files of a sharded safetensors view: include/ckptfs/sharding.hpp.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "ckptfs/error.hpp"
#include "ckptfs/sharding.hpp"

namespace ckptfs::views {

namespace {

// save_pretrained's index: {"metadata": {"total_parameters": model.num_parameters() (each parameter once, no
// buffer: what the checkpoint names as buffers and tied aliases is left out), "total_size": the bytes of
// all shards' tensors}, "weight_map": {tensor: shard file}}, through json.dumps(indent=2, sort_keys=True):
// nlohmann's object keeps its keys sorted bytewise (code point order, as Python sorts str) and dump with
// ensure_ascii escapes as json.dumps does.
std::string shard_index(const catalog::Catalog& catalog, const std::vector<std::vector<size_t>>& shards) {
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t parameters = 0, bytes = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shard_file_name(s, shards.size());
    for (size_t i : shards[s]) {
      const auto& t = catalog.tensors[i];
      if (!weight_map.emplace(t.name, file).second)
        throw FormatError(fmt::format("safetensors view: tensor name {} appears twice", t.name));
      if (t.role == catalog::ModelRole::parameter) parameters += t.numel();
      bytes += t.nbytes();
    }
  }
  const nlohmann::json index = {{"metadata", {{"total_parameters", parameters}, {"total_size", bytes}}},
                                {"weight_map", std::move(weight_map)}};
  try {
    return index.dump(2, ' ', true) + "\n";
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(fmt::format("{}: cannot write it: {}", kShardIndexName, e.what()));
  }
}

}  // namespace

std::vector<NamedFile> make_sharded_safetensors(std::shared_ptr<const catalog::Catalog> catalog,
                                                const catalog::Catalog& model, uint64_t max_shard_size) {
  // what fits one shard needs no plan (the usual case: a model under the default 50GB)
  const auto shards = catalog->total_bytes() <= max_shard_size
                          ? std::vector<std::vector<size_t>>{}
                          : plan_shards(*catalog, state_dict_order(*catalog, model), max_shard_size);
  if (shards.size() <= 1) return {{std::string(kSafetensorsName), make_safetensors(std::move(catalog))}};
  std::vector<NamedFile> files;
  for (size_t s = 0; s < shards.size(); ++s)
    files.push_back({shard_file_name(s, shards.size()), make_safetensors(catalog, shards[s])});
  files.push_back({std::string(kShardIndexName), make_bytes_file(shard_index(*catalog, shards))});
  return files;
}

}  // namespace ckptfs::views
