#include "formats/megatron/nemo_rl_layout.hpp"

#include "formats/save_dir.hpp"

namespace ckptfs::megatron {

std::filesystem::path nemo_rl_weights(const std::filesystem::path& step) {
  return step / "policy" / "weights";
}

std::filesystem::path nemo_rl_tokenizer(const std::filesystem::path& step) {
  return step / "policy" / "tokenizer";
}

std::vector<std::filesystem::path> nemo_rl_steps(
    const io::Source& source, const std::filesystem::path& dir,
    const std::function<bool(const std::filesystem::path&)>& is_weights) {
  return formats::sorted_subdirs(source, dir, [&](const std::filesystem::path& d) {
    const std::string name = d.filename().string();
    return name.starts_with("step_") && name.size() > 5 &&
           formats::is_decimal(std::string_view(name).substr(5)) && is_weights(nemo_rl_weights(d));
  });
}

}  // namespace ckptfs::megatron
