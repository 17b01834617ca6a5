// Tensor-parallel tags (Megatron-DeepSpeed, AutoTP): every TP rank read as a tag of its own, then merged by
// the patterns of the checkpoint's universal_checkpoint_info (tensor_parallel_merge.hpp).
#include <fmt/format.h>

#include "ckptfs/error.hpp"
#include "formats/deepspeed/layout_readers.hpp"

namespace ckptfs::deepspeed {

namespace fs = std::filesystem;

namespace {

// The files tensor-parallel rank `tp` of a pipeline tag reads: its stages' model-states and optimizer
// files (DeepSpeed numbers them by the rank among data rank 0's ranks: stage x TP + tp) and its layer
// files (layer_XX-model_<tp>), as a tag of its own.
TagFiles pipeline_rank_files(const TagFiles& tf, int tp, int tp_size, const fs::path& dir) {
  const int stages = tf.model_states.empty() ? 0 : tf.model_states.rbegin()->first / tp_size + 1;
  for (int mp = tp; mp < stages * tp_size; mp += tp_size)
    if (!tf.model_states.contains(mp))
      throw FormatError(
          fmt::format("{}: missing (a pipeline of {} stages x {} tensor-parallel ranks has one per rank)",
                      (dir / fmt::format("mp_rank_{:02d}_model_states.pt", mp)).string(), stages, tp_size));
  TagFiles out;
  out.bf16_prefix = tf.bf16_prefix;
  for (const auto& [mp, path] : tf.model_states)
    if (mp % tp_size == tp) out.model_states.emplace(mp, path);
  for (const auto& [mp, dps] : tf.optim_states)
    if (mp % tp_size == tp) out.optim_states.emplace(mp, dps);
  for (const auto& [layer, tps] : tf.layer_states) {
    auto it = tps.find(tp);
    if (it == tps.end() || static_cast<int>(tps.size()) != tp_size)
      throw FormatError(fmt::format("{}: layer {} has files for {} tensor-parallel ranks, layer {} for {}",
                                    dir.string(), layer, tps.size(), tf.layer_states.begin()->first,
                                    tp_size));
    out.layer_states[layer][0] = it->second;
  }
  return out;
}

// The tag of files `tf`, its ranks merged by `info`.
Tag merged(std::vector<RankTag> ranks, const UniversalInfo& info, const TagFiles& tf) {
  Tag tag = merge_tensor_parallel_ranks(std::move(ranks), info);
  tag.files = tf.all();
  return tag;
}

}  // namespace

// Each mp_rank_XX_model_states.pt and its ZeRO partitions is a TP rank.
Tag read_tensor_parallel(io::FileSet& files, const TagFiles& tf, const fs::path& dir,
                         const std::string& name) {
  const UniversalInfo info = read_universal_info(files, tf.model_states.begin()->second);
  std::vector<RankTag> ranks;
  for (const auto& [mp, path] : tf.model_states)
    ranks.push_back(read_rank(files, tf, dir, name, mp, RankLayout::data_parallel));
  return merged(std::move(ranks), info, tf);
}

// Pipeline layers saved per TP rank (layer_XX-model_YY: Megatron-DeepSpeed's GPTModelPipe).
Tag read_pipeline_tensor_parallel(io::FileSet& files, const TagFiles& tf, const fs::path& dir,
                                  const std::string& name) {
  const UniversalInfo info = read_universal_info(files, tf.model_states.begin()->second);
  const int tp_size = static_cast<int>(tf.layer_states.begin()->second.size());
  std::vector<RankTag> ranks;
  for (int tp = 0; tp < tp_size; ++tp) {
    const TagFiles rank = pipeline_rank_files(tf, tp, tp_size, dir);
    ranks.push_back(read_rank(files, rank, dir, name, first_mp_rank(rank), RankLayout::pipeline));
  }
  return merged(std::move(ranks), info, tf);
}

}  // namespace ckptfs::deepspeed
