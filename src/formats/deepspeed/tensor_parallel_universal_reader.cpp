// The universal checkpoint of a tensor-parallel run (ds_to_universal's output for an AutoTP tag, which
// DeepSpeed 0.19.5 saves with its universal_checkpoint_info): every TP rank's model-state copy holds its
// slices of the weights, merged here as for the tag; zero/<param>/fp32.pt holds each master merged already.
#include <fmt/format.h>

#include <optional>

#include "ckptfs/error.hpp"
#include "formats/deepspeed/layout_readers.hpp"
#include "formats/deepspeed/tag_catalogs.hpp"
#include "formats/deepspeed/universal_input.hpp"

namespace ckptfs::deepspeed {

using catalog::Catalog;
namespace fs = std::filesystem;

Tag read_tensor_parallel_universal(io::FileSet& files, const TagFiles& tf, const fs::path& dir,
                                   const std::string& name) {
  const UniversalInfo info = read_universal_info(files, tf.model_states.begin()->second);
  std::vector<RankTag> ranks;
  std::optional<ModelStates> first;
  for (const auto& [mp, path] : tf.model_states) {
    ModelStates ms = read_model_states(files, path);
    if (!ms.module)
      throw FormatError(
          fmt::format("{}: 'module' is None in a tensor-parallel universal checkpoint", path.string()));
    TagParts rank;
    rank.module = *ms.module;
    RankTag& r = ranks.emplace_back();
    r.tag.dir = dir;
    r.tag.add(ViewRole::model, std::make_shared<Catalog>(build_model_catalog(rank, false, r.tag.notes)));
    r.buffers.insert(ms.buffer_names.begin(), ms.buffer_names.end());
    if (!first) first = std::move(ms);
  }
  if (!first->param_shapes)
    throw FormatError(
        fmt::format("{}: has no param_shapes, which a universal checkpoint needs", first->path.string()));
  Tag tag = merge_tensor_parallel_ranks(std::move(ranks), info);
  tag.name = name;
  tag.format = kUniversalFormat;
  tag.files = tf.all();
  tag.deepspeed.value().zero_stage = static_cast<int>(first->config_zero_stage.value_or(0));
  tag.topology.dp = static_cast<int>(first->dp_world_size.value_or(1));
  tag.topology.optimizer = kUniversalOptimizer;
  TagParts parts;
  parts.no_universal = kUniversalSource;
  parts.buffers.insert(first->buffer_names.begin(), first->buffer_names.end());
  parts.aliases = first->shared_params;
  parts.trainable =
      read_universal_masters(files, dir, *first->param_shapes, static_cast<int>(tf.model_states.size()));
  add_master_files(tag, parts);
  CatalogPtr model =
      tag.catalog(ViewRole::model);  // the merge's only catalog: finish_tag adds it back with fp32
  tag.models.clear();
  auto fp32 = std::make_shared<Catalog>(build_fp32_catalog(parts, model->tensors, tag.notes));
  finish_tag(tag, parts, fp32, model, false);
  return tag;
}

}  // namespace ckptfs::deepspeed
