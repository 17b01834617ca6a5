// The naming heuristics against gguf-py 0.19's own Metadata.get_model_id_components / id_to_title (recorded
// from python3-gguf in the Debian unstable chroot) and utility.py's size_label.
#include "views/gguf/gguf_naming.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace ckptfs::views::gguf {
namespace {

struct Expected {
  const char* directory;
  uint64_t total;
  const char* name;
  std::optional<std::string> basename, finetune, version, size_label;
};

TEST(GgufNaming, FollowsGgufPysHeuristics) {
  const std::optional<std::string> none;
  const Expected cases[] = {
      {"hf", 17'000'000, "Hf", none, none, none, "17M"},
      {"checkpoint-500", 17'000'000, "Checkpoint 500", "checkpoint", none, "500", "17M"},
      {"Llama-3-8B-Instruct-v0.2", 17'000'000, "Llama 3 8B Instruct v0.2", "Llama-3", "8b-Instruct", "v0.2",
       "17M"},
      {"Llama-3-8B-Instruct-v0.2", 7'000'000'000, "Llama 3 8B Instruct v0.2", "Llama-3", "Instruct", "v0.2",
       "8B"},
      {"ckpt_v2", 17'000'000, "Ckpt_V2", none, none, none, "17M"},
      {"global_step1000", 17'000'000, "Global_Step1000", none, none, none, "17M"},
      {"llama3rope", 17'000'000, "Llama3Rope", none, none, none, "17M"},
      {"bloom-7b1", 17'000'000, "Bloom 7b1", "bloom", "7.1b", none, "17M"},
      {"bloom-7b1", 7'000'000'000, "Bloom 7b1", "bloom", none, none, "7.1B"},
      {"Mixtral-8x7B-v0.1", 17'000'000, "Mixtral 8x7B v0.1", "Mixtral", none, "v0.1", "8x7B"},
      {"Qwen3-30B-A3B", 7'000'000'000, "Qwen3 30B A3B", "Qwen3", "30b", none, "A3B"},
      {"model-Q8_0-small", 17'000'000, "Model Q8_0 Small", "model", none, none, "small"},
      {"v2-iter3", 17'000'000, "v2 Iter3", none, none, "v2-iter3", "17M"},
      {"my_model-7B-chat", 7'000'000'000, "My_Model 7B Chat", "my_model", "chat", none, "7B"},
      {"gpt2-xl", 17'000'000, "Gpt2 Xl", "gpt2", none, none, "xl"},
      {"Phi-3-mini-128k-instruct", 17'000'000, "Phi 3 Mini 128k Instruct", "Phi-3", "128k-instruct", none,
       "mini"},
  };
  for (const auto& c : cases) {
    const ModelNaming n = name_model(c.directory, {c.total, c.total, 0, 0});
    EXPECT_EQ(n.name, c.name) << c.directory;
    EXPECT_EQ(n.basename, c.basename) << c.directory;
    EXPECT_EQ(n.finetune, c.finetune) << c.directory;
    EXPECT_EQ(n.version, c.version) << c.directory;
    EXPECT_EQ(n.size_label, c.size_label) << c.directory << " " << c.total;
  }
}

TEST(GgufNaming, MoeSizeLabelAndFileName) {
  // utility.py: "{experts}x{shared + one expert's}" rounded as the total would be
  const ModelNaming n = name_model("checkpoint-500", {8'500'000, 500'000, 2'000'000, 4});
  EXPECT_EQ(n.size_label, "4x2.5M");
  EXPECT_EQ(gguf_file_name(n, "Q8_0"), "checkpoint-4x2.5M-500-Q8_0.gguf");
  EXPECT_EQ(gguf_file_name(name_model("hf", {16'823'744, 16'823'744, 0, 0}), "BF16"), "Hf-17M-BF16.gguf");
}

TEST(GgufNaming, DirectoryNames) {
  EXPECT_TRUE(valid_directory_name("Llama-3-8B-Instruct-v0.2"));
  EXPECT_FALSE(valid_directory_name(""));
  EXPECT_FALSE(valid_directory_name(".hidden"));
  EXPECT_FALSE(valid_directory_name("a/b"));
  EXPECT_FALSE(valid_directory_name("two words"));
  EXPECT_FALSE(valid_directory_name("---"));
}

}  // namespace
}  // namespace ckptfs::views::gguf
