#include "formats/deepspeed/tag_layout.hpp"

#include <fmt/format.h>

#include <string_view>

#include "ckptfs/error.hpp"
#include "formats/deepspeed/state_files.hpp"
#include "formats/deepspeed/universal_input.hpp"

namespace ckptfs::deepspeed {

namespace {

void require_one_zero3_mp_rank(const TagFiles& tf, std::string_view checkpoints) {
  if (tf.zero3_model_states.size() > 1)
    throw UnsupportedError(
        fmt::format("{}: tensor-parallel ZeRO-3 {} (several mp ranks) are not supported yet",
                    tf.zero3_model_states.rbegin()->second.begin()->second.string(), checkpoints));
}

}  // namespace

TagLayout tag_layout(io::FileSet& files, const TagFiles& tf, const std::filesystem::path& dir) {
  if (is_universal_dir(files.source(), dir)) {
    // Several model-state copies: TP ranks (`module` set) or pipeline stages (`module` None).
    if (tf.model_states.size() > 1 && read_model_states(files, tf.model_states.begin()->second).module)
      return TensorParallelUniversal{};
    if (tf.zero3_model_states.empty()) return RankLayout::universal;
    require_one_zero3_mp_rank(tf, "universal checkpoints");
    return RankLayout::zero3_universal;
  }
  if (!tf.zero3_model_states.empty()) {
    require_one_zero3_mp_rank(tf, "checkpoints");
    return RankLayout::zero3;
  }
  if (!tf.layer_states.empty())  // the first layer's files tell the TP size: layer_XX-model_<tp>
    return tf.layer_states.begin()->second.size() > 1 ? TagLayout(PipelineTensorParallel{})
                                                      : RankLayout::pipeline;
  return tf.model_states.size() > 1 ? TagLayout(TensorParallel{}) : RankLayout::data_parallel;
}

}  // namespace ckptfs::deepspeed
