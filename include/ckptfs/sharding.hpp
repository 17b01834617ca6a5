// Sharded safetensors views: what transformers 5.x's save_pretrained(max_shard_size=SIZE) writes for a
// model larger than SIZE (model-0000I-of-0000N.safetensors and model.safetensors.index.json), split
// where it splits (huggingface_hub's split_state_dict_into_shards_factory, docs/mount.md "Sharded views").
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "ckptfs/views.hpp"

namespace ckptfs::views {

// save_pretrained's default max_shard_size in transformers 5.x ("50GB"), also the Hub's limit per file.
inline constexpr uint64_t kDefaultShardSize = 50'000'000'000;
inline constexpr std::string_view kSafetensorsName = "model.safetensors";
inline constexpr std::string_view kShardIndexName = "model.safetensors.index.json";

// SIZE as save_pretrained takes max_shard_size: a number with a decimal unit, case-insensitive, spaces
// allowed ("5GB", "1.5 gb", "60KB": huggingface_hub's parse_size_to_int, int(value * unit) in doubles), or
// plain bytes (an int max_shard_size); also KiB/MiB/GiB (integer value, binary: transformers'
// convert_file_size_to_int, which 5.x's save_pretrained no longer calls). Throws std::invalid_argument
// saying what a SIZE may be.
uint64_t parse_shard_size(std::string_view text);

// The shards of `catalog` as split_state_dict_into_shards_factory makes them from a state dict of its
// tensors in the order `order` (indices into catalog.tensors): indices, each shard in that order. A tensor
// larger than max_shard_size gets a shard of its own, placed before the shard being filled; otherwise a
// tensor that would take the shard being filled past max_shard_size starts the next one.
std::vector<std::vector<size_t>> plan_shards(const catalog::Catalog& catalog, std::span<const size_t> order,
                                             uint64_t max_shard_size);

// The state_dict order of `view`'s tensors (indices) where they are the tensors of `model` in another
// dtype (fp32/ beside model.safetensors): `model`'s order, which the model save_pretrained is called on
// iterates; tensors `model` lacks follow in their own order.
std::vector<size_t> state_dict_order(const catalog::Catalog& view, const catalog::Catalog& model);

// "model-00002-of-00005.safetensors" (index 1 of 5), as save_pretrained names shards.
std::string shard_file_name(size_t index, size_t count);

struct NamedFile {
  std::string name;  // relative to the view's folder
  VirtualFilePtr file;
};

// The files save_pretrained(max_shard_size) writes for the tensors of `catalog`, split in the
// state_dict order of `model` (state_dict_order): model.safetensors when they fit one shard, else the
// shards (each a safetensors file as make_safetensors writes it) and model.safetensors.index.json
// ({"metadata": {"total_parameters", "total_size"}, "weight_map"}, keys sorted, indent 2, ASCII escapes,
// a final newline: json.dumps(index, indent=2, sort_keys=True) + "\n").
std::vector<NamedFile> make_sharded_safetensors(std::shared_ptr<const catalog::Catalog> catalog,
                                                const catalog::Catalog& model, uint64_t max_shard_size);

}  // namespace ckptfs::views
