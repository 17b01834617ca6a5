#include "formats/megatron/nemo2_layout.hpp"

#include "ckptfs/io_tree.hpp"
#include "formats/megatron/iteration.hpp"
#include "formats/save_dir.hpp"

namespace ckptfs::megatron {

namespace fs = std::filesystem;

fs::path nemo2_weights(const fs::path& checkpoint) {
  return checkpoint / "weights";
}

std::optional<fs::path> nemo2_model_yaml_of_weights(const fs::path& weights) {
  if (weights.filename() != "weights") return std::nullopt;
  const fs::path yaml = weights.parent_path() / "context" / "model.yaml";
  return io::is_file(yaml) ? std::optional(yaml) : std::nullopt;
}

std::optional<fs::path> nemo2_tokenizer(const fs::path& checkpoint) {
  for (const char* name : {"nemo_tokenizer", "tokenizer"})
    if (io::is_directory(checkpoint / "context" / name)) return checkpoint / "context" / name;
  return std::nullopt;
}

bool is_nemo2_checkpoint(const fs::path& dir) {
  return io::is_directory(dir / "context") && is_torch_dist_iteration(nemo2_weights(dir));
}

std::vector<fs::path> nemo2_checkpoints(const fs::path& dir) {
  return formats::sorted_subdirs(dir, is_nemo2_checkpoint);
}

}  // namespace ckptfs::megatron
