// The layout decided for the tags of the real DeepSpeed fixtures (each fixture's README says how it was
// saved), for pipeline layers saved per tensor-parallel rank (named files: the decision reads no pipeline
// file), and the refusal of tensor-parallel ZeRO-3, which names a file and what is not supported.
#include "formats/deepspeed/tag_layout.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "ckptfs/deepspeed.hpp"
#include "ckptfs/error.hpp"
#include "io/test_source.hpp"

namespace ckptfs::deepspeed {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(CKPTFS_SOURCE_DIR) / "mount_tests/fixtures";

TagLayout layout_of(const fs::path& dir) {
  const io::SourcePtr source = io::test_source(dir);
  io::FileSet files(*source);
  return tag_layout(files, list_tag_files(*source, dir), dir);
}

TEST(TagLayout, OfEveryRealFixtureTag) {
  const std::vector<std::pair<std::string, TagLayout>> cases = {
      {"deepspeed-real/z0_bf16_ws2/checkpoint/global_step3", RankLayout::data_parallel},
      {"deepspeed-real/z1_fp32_ws4/checkpoint/global_step3", RankLayout::data_parallel},
      {"deepspeed-real/z2_bf16_ws2/checkpoint/global_step3", RankLayout::data_parallel},
      {"deepspeed-0.19-real/z0_bf16_ws2/checkpoint/global_step3", RankLayout::data_parallel},
      {"deepspeed-0.19-real/moe_ep2_z2_bf16_ws2/checkpoint/global_step3", RankLayout::data_parallel},
      {"deepspeed-real/z3_fp16_ws2/checkpoint/global_step3", RankLayout::zero3},
      {"deepspeed-0.19-real/z3_bf16_pg2_ws2/checkpoint/global_step3", RankLayout::zero3},
      {"deepspeed-real/pp2_z1_fp32_ws4/checkpoint/global_step3", RankLayout::pipeline},
      {"deepspeed-0.19-real/pp2_bf16_ws2/checkpoint/global_step3", RankLayout::pipeline},
      {"deepspeed-real/z0_bf16_ws2/checkpoint/global_step3_universal", RankLayout::universal},
      {"deepspeed-real/z2_bf16_ws2/checkpoint/global_step3_universal", RankLayout::universal},
      {"deepspeed-real/pp2_z1_fp32_ws4/checkpoint/global_step3_universal", RankLayout::universal},
      {"deepspeed-real/z3_fp16_ws2/checkpoint/global_step3_universal", RankLayout::zero3_universal},
      {"deepspeed-0.19-real/z3_bf16_pg2_ws2/checkpoint/global_step3_universal", RankLayout::zero3_universal},
      {"deepspeed-0.19-real/autotp2_z1_bf16_ws2/checkpoint/global_step3", TensorParallel{}},
      {"deepspeed-0.19-real/autotp2_z1_bf16_ws2/checkpoint/global_step3_universal",
       TensorParallelUniversal{}},
  };
  for (const auto& [tag, layout] : cases) EXPECT_TRUE(layout_of(kFixtures / tag) == layout) << tag;
}

class TagLayoutOfNamedFiles : public testing::Test {
 protected:
  const fs::path dir = fs::path(testing::TempDir()) / "deepspeed-tag-layout";
  void SetUp() override {
    fs::remove_all(dir);
    fs::create_directories(dir / "zero");
  }
  void TearDown() override { fs::remove_all(dir); }
  void add(const std::vector<std::string>& names) const {
    for (const auto& name : names) std::ofstream(dir / name).put('x');
  }
  // What read_tag refuses the tag with; empty when it does not refuse it as unsupported.
  std::string unsupported() const {
    const io::SourcePtr source = io::test_source(dir);
    io::FileSet files(*source);
    try {
      read_tag(files, dir, "global_step3");
    } catch (const UnsupportedError& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(TagLayoutOfNamedFiles, PipelineLayersOfSeveralTensorParallelRanks) {
  add({"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt", "layer_01-model_00-model_states.pt",
       "layer_01-model_01-model_states.pt"});
  EXPECT_TRUE(layout_of(dir) == TagLayout(PipelineTensorParallel{}));
}

TEST_F(TagLayoutOfNamedFiles, TensorParallelZero3IsRefused) {
  add({"zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_01_model_states.pt"});
  EXPECT_EQ(unsupported(),
            (dir / "zero_pp_rank_0_mp_rank_01_model_states.pt").string() +
                ": tensor-parallel ZeRO-3 checkpoints (several mp ranks) are not supported yet");
}

TEST_F(TagLayoutOfNamedFiles, TensorParallelZero3UniversalIsRefused) {
  add({"zero/optimizer_state.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt",
       "zero_pp_rank_0_mp_rank_01_model_states.pt"});
  EXPECT_EQ(unsupported(),
            (dir / "zero_pp_rank_0_mp_rank_01_model_states.pt").string() +
                ": tensor-parallel ZeRO-3 universal checkpoints (several mp ranks) are not supported yet");
}

}  // namespace
}  // namespace ckptfs::deepspeed
