// The fp32 masters of ZeRO-0 FP16_UnfusedOptimizer (named by module order, group by group, frozen params
// and tied repeats skipped, an ambiguous or impossible match refused) and FP16_Optimizer (sliced by the
// params' offsets in their group's flat 16-bit buffer).
#include "formats/deepspeed/model_state_masters.hpp"

#include <gtest/gtest.h>

#include "catalog/test_sources.hpp"
#include "ckptfs/error.hpp"

namespace ckptfs::deepspeed {
namespace {

class UnfusedMastersTest : public ::testing::Test {
 protected:
  // A tensor of `shape` at element `offset` of the file (distinct offsets: distinct tensors).
  torch::SourceTensor tensor(std::vector<int64_t> shape, int64_t offset, DType dtype = DType::BF16) const {
    torch::SourceTensor t;
    t.storage = {file_.file(), 0, file_.file()->size()};
    t.dtype = dtype;
    t.shape = shape;
    t.strides.assign(shape.size(), 1);
    for (size_t d = shape.size(); d-- > 1;) t.strides[d - 1] = t.strides[d] * shape[d];
    t.storage_offset = offset;
    return t;
  }

  // `module` entries (name, shape); an entry named "=owner" repeats that entry's tensor (a tied alias).
  ModelStates states(const std::vector<std::pair<std::string, std::vector<int64_t>>>& module,
                     const std::vector<std::vector<std::vector<int64_t>>>& groups) const {
    ModelStates ms;
    ms.path = "mp_rank_00_model_states.pt";
    ms.module.emplace();
    for (size_t i = 0; i < module.size(); ++i) {
      const auto& [name, shape] = module[i];
      const auto eq = name.find('=');
      if (eq == std::string::npos) {
        ms.module->push_back({name, tensor(shape, static_cast<int64_t>(i))});
        continue;
      }
      for (const auto& e : *ms.module)
        if (e.name == name.substr(eq + 1)) ms.module->push_back({name.substr(0, eq), e.tensor});
    }
    ms.unfused_fp32_groups.emplace();
    int64_t offset = 1000;
    for (const auto& g : groups) {
      auto& out = ms.unfused_fp32_groups->emplace_back();
      for (const auto& shape : g) out.push_back(tensor(shape, offset++, DType::F32));
    }
    return ms;
  }

  static std::vector<std::string> names(const ModelStateMasters& m) {
    std::vector<std::string> out;
    for (const auto& t : m.trainable) out.push_back(t.name);
    return out;
  }

  testing::SourceFile file_ = testing::SourceFile::of(std::vector<float>(4096));
};

TEST_F(UnfusedMastersTest, SkipsBuffersFrozenParamsAndTiedRepeats) {
  ModelStates ms = states(
      {{"pos", {7, 4}}, {"bias", {5}}, {"mix", {4}}, {"embed", {5, 4}}, {"ln", {4}}, {"head=embed", {}}},
      {{{5}, {5, 4}, {4}}});
  ms.buffer_names = {"mix"};
  const ModelStateMasters m = name_unfused_masters(ms);
  EXPECT_EQ(names(m), (std::vector<std::string>{"bias", "embed", "ln"}));
  ASSERT_EQ(m.aliases.size(), 1u);
  EXPECT_EQ(m.aliases[0], (std::pair<std::string, std::string>{"head", "embed"}));
  EXPECT_EQ(m.trainable[1].dtype, DType::F32);
  EXPECT_EQ(m.trainable[1].shape, (std::vector<int64_t>{5, 4}));
}

TEST_F(UnfusedMastersTest, InterleavedGroupsMatchedOneAfterAnother) {
  // decay group: the matrices; no-decay group: the vectors (HF Trainer)
  ModelStates ms =
      states({{"a.w", {3, 4}}, {"a.b", {3}}, {"b.w", {4, 3}}, {"b.b", {4}}}, {{{3, 4}, {4, 3}}, {{3}, {4}}});
  EXPECT_EQ(names(name_unfused_masters(ms)), (std::vector<std::string>{"a.w", "b.w", "a.b", "b.b"}));
}

TEST_F(UnfusedMastersTest, FrozenTwinOfATrainableParamIsAmbiguous) {
  ModelStates ms = states({{"ln.weight", {4}}, {"ln.bias", {4}}, {"fc", {3, 4}}}, {{{4}, {3, 4}}});
  try {
    name_unfused_masters(ms);
    FAIL() << "expected UnsupportedError";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("mp_rank_00_model_states.pt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ln.bias"), std::string::npos) << e.what();
  }
}

TEST_F(UnfusedMastersTest, MastersOutOfModuleOrderAreAnError) {
  ModelStates ms = states({{"a", {3}}, {"b", {4}}}, {{{4}, {3}}});
  EXPECT_THROW(name_unfused_masters(ms), FormatError);
}

TEST_F(UnfusedMastersTest, NonFloatingMasterIsAnError) {
  ModelStates ms = states({{"a", {3}}}, {{{3}}});
  (*ms.unfused_fp32_groups)[0][0].dtype = DType::I64;
  EXPECT_THROW(name_unfused_masters(ms), FormatError);
}

// FP16_Optimizer: module params are views into one bf16 flat buffer per group (a storage of the group's
// elements at byte `at` of the file); fp32_groups_flat[g] has those elements.
class FusedMastersTest : public UnfusedMastersTest {
 protected:
  torch::SourceTensor view(uint64_t at, uint64_t elements, std::vector<int64_t> shape, int64_t offset) const {
    torch::SourceTensor t = tensor(std::move(shape), offset);
    t.storage = {file_.file(), at, elements * 2};
    return t;
  }
  torch::SourceTensor flat(uint64_t elements, int64_t offset) const {
    return tensor({static_cast<int64_t>(elements)}, offset, DType::F32);
  }
};

TEST_F(FusedMastersTest, EachParamTakesItsOffsetInItsGroupsBuffer) {
  ModelStates ms;
  ms.path = "mp_rank_00_model_states.pt";
  // group 0 buffer (at byte 0, 14 elements): w [2, 4] at 0, v [3, 2] at 8; group 1 buffer (byte 64, 3): b;
  // frozen f owns 5 elements at byte 128; t repeats w
  ms.module = std::vector<NamedTensor>{{"b", view(64, 3, {3}, 0)},
                                       {"f", view(128, 5, {5}, 0)},
                                       {"w", view(0, 14, {2, 4}, 0)},
                                       {"v", view(0, 14, {3, 2}, 8)},
                                       {"t", view(0, 14, {2, 4}, 0)}};
  ms.fused_fp32_groups_flat = std::vector<torch::SourceTensor>{flat(14, 100), flat(3, 200)};
  const ModelStateMasters m = slice_fused_masters(ms);
  EXPECT_EQ(names(m), (std::vector<std::string>{"w", "v", "b"}));
  ASSERT_EQ(m.aliases.size(), 1u);
  EXPECT_EQ(m.aliases[0].first, "t");
  // v: elements [8, 14) of group 0's master, shaped [3, 2]
  const catalog::LogicalTensor& v = m.trainable[1];
  EXPECT_EQ(v.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(v.dtype, DType::F32);
  const auto* runs = std::get_if<catalog::FlatRuns>(&v.source);
  ASSERT_NE(runs, nullptr);
  ASSERT_EQ(runs->pieces.size(), 1u);
  EXPECT_EQ(runs->pieces[0].src_offset, 4 * (100 + 8));
}

TEST_F(FusedMastersTest, NoBufferOfTheGroupsSizeIsAnError) {
  ModelStates ms;
  ms.path = "mp_rank_00_model_states.pt";
  ms.module = std::vector<NamedTensor>{{"w", view(0, 8, {2, 4}, 0)}};
  ms.fused_fp32_groups_flat = std::vector<torch::SourceTensor>{flat(9, 100)};
  EXPECT_THROW(slice_fused_masters(ms), FormatError);
}

TEST_F(FusedMastersTest, TwoBuffersOfTheGroupsSizeAreAmbiguous) {
  ModelStates ms;
  ms.path = "mp_rank_00_model_states.pt";
  ms.module = std::vector<NamedTensor>{{"a", view(0, 4, {4}, 0)}, {"frozen", view(64, 4, {4}, 0)}};
  ms.fused_fp32_groups_flat = std::vector<torch::SourceTensor>{flat(4, 100)};
  EXPECT_THROW(slice_fused_masters(ms), UnsupportedError);
}

}  // namespace
}  // namespace ckptfs::deepspeed
