// Naming FP16_UnfusedOptimizer's fp32 masters: module order, group by group, frozen params and tied
// repeats skipped, an ambiguous or impossible match refused.
#include "formats/deepspeed/unfused_masters.hpp"

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

  static std::vector<std::string> names(const UnfusedMasters& m) {
    std::vector<std::string> out;
    for (const auto& t : m.trainable) out.push_back(t.name);
    return out;
  }

  testing::SourceFile file_ = testing::SourceFile::of(std::vector<float>(4096));
};

TEST_F(UnfusedMastersTest, SkipsBuffersFrozenParamsAndTiedRepeats) {
  ModelStates ms = states({{"pos", {7, 4}}, {"bias", {5}}, {"mix", {4}}, {"embed", {5, 4}}, {"ln", {4}},
                           {"head=embed", {}}},
                          {{{5}, {5, 4}, {4}}});
  ms.buffer_names = {"mix"};
  const UnfusedMasters m = name_unfused_masters(ms);
  EXPECT_EQ(names(m), (std::vector<std::string>{"bias", "embed", "ln"}));
  ASSERT_EQ(m.aliases.size(), 1u);
  EXPECT_EQ(m.aliases[0], (std::pair<std::string, std::string>{"head", "embed"}));
  EXPECT_EQ(m.trainable[1].dtype, DType::F32);
  EXPECT_EQ(m.trainable[1].shape, (std::vector<int64_t>{5, 4}));
}

TEST_F(UnfusedMastersTest, InterleavedGroupsMatchedOneAfterAnother) {
  // decay group: the matrices; no-decay group: the vectors (HF Trainer)
  ModelStates ms = states({{"a.w", {3, 4}}, {"a.b", {3}}, {"b.w", {4, 3}}, {"b.b", {4}}},
                          {{{3, 4}, {4, 3}}, {{3}, {4}}});
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

}  // namespace
}  // namespace ckptfs::deepspeed
