#include "formats/megatron/nemo2_layout.hpp"

#include "ckptfs/io_tree.hpp"
#include "formats/megatron/iteration.hpp"
#include "formats/save_dir.hpp"

namespace ckptfs::megatron {

namespace fs = std::filesystem;

fs::path nemo2_weights(const fs::path& checkpoint) {
  return checkpoint / "weights";
}

std::optional<fs::path> nemo2_model_yaml_of_weights(const io::Source& source, const fs::path& weights) {
  if (weights.filename() != "weights") return std::nullopt;
  const fs::path yaml = weights.parent_path() / "context" / "model.yaml";
  return source.is_file(yaml) ? std::optional(yaml) : std::nullopt;
}

std::optional<fs::path> nemo2_tokenizer(const io::Source& source, const fs::path& checkpoint) {
  for (const char* name : {"nemo_tokenizer", "tokenizer"})
    if (source.is_directory(checkpoint / "context" / name)) return checkpoint / "context" / name;
  return std::nullopt;
}

bool is_nemo2_checkpoint(const io::Source& source, const fs::path& dir) {
  return source.is_directory(dir / "context") && is_torch_dist_iteration(source, nemo2_weights(dir));
}

std::vector<fs::path> nemo2_checkpoints(const io::Source& source, const fs::path& dir) {
  return formats::sorted_subdirs(source, dir,
                                 [&](const fs::path& d) { return is_nemo2_checkpoint(source, d); });
}

}  // namespace ckptfs::megatron
