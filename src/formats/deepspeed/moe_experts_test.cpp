// MoE expert placement and master assembly against a hand-made layout: 4 ranks, EP 2, 4 experts (2 per EP
// rank), each rank's partitions holding values that say which expert element they are.
#include "formats/deepspeed/moe_experts.hpp"

#include <gtest/gtest.h>

#include "catalog/test_sources.hpp"
#include "ckptfs/error.hpp"

namespace ckptfs::deepspeed {
namespace {

using testing::float_slice;

constexpr const char* kPrefix = "m.deepspeed_moe.experts.deepspeed_experts.";
constexpr uint64_t kDense = 5, kExpert = 3, kWorld = 4, kEp = 2, kLocal = 2;

std::string expert_param(uint64_t id) {
  return kPrefix + std::to_string(id) + ".w";
}

NamedTensor named(const std::string& name, const torch::SourceTensor& t) {
  return {name, t};
}

std::vector<std::string> names(const std::vector<NamedTensor>& v) {
  std::vector<std::string> out;
  for (const auto& e : v) out.push_back(e.name);
  return out;
}

// Dense element i holds 100 + i; element j of global expert x holds 1000 x + j; padding -7.
struct Layout {
  std::vector<float> data;
  std::vector<std::pair<uint64_t, uint64_t>> dense, experts;  // per rank: first element, count stored

  explicit Layout(bool data_before_expert) : dense(kWorld), experts(kWorld) {
    const uint64_t dense_slice = 2;  // 5 padded to 2 x 4 = 8, over 4 ranks
    for (uint64_t r = 0; r < kWorld; ++r) {
      dense[r] = {data.size(), std::min(dense_slice, kDense - std::min(kDense, r * dense_slice))};
      for (uint64_t i = r * dense_slice; i < (r + 1) * dense_slice; ++i)
        data.push_back(i < kDense ? static_cast<float>(100 + i) : -7.0f);
    }
    const uint64_t edp = kWorld / kEp, total = kLocal * kExpert, slice = 4;  // 6 padded to 2 x 2 = 8
    for (uint64_t r = 0; r < kWorld; ++r) {
      const uint64_t ep = data_before_expert ? r / edp : r % kEp, k = data_before_expert ? r % edp : r / kEp;
      experts[r] = {data.size(), k + 1 == edp ? total - k * slice : slice};
      for (uint64_t e = k * slice; e < (k + 1) * slice; ++e)
        data.push_back(e < total ? static_cast<float>(1000 * (ep * kLocal + e / kExpert) + e % kExpert)
                                 : -7.0f);
    }
  }
};

std::vector<float> read_all(const catalog::LogicalTensor& t) {
  std::vector<float> out(t.numel());
  catalog::read_tensor(t, 0, std::as_writable_bytes(std::span(out)));
  return out;
}

class MoeMastersTest : public ::testing::TestWithParam<bool> {};

TEST_P(MoeMastersTest, ExpertGroupsComeFromEachEpRanksExpertDataParallelGroup) {
  const bool data_before_expert = GetParam();
  Layout layout(data_before_expert);
  const auto file = testing::SourceFile::of(layout.data);
  ModelStates ms;
  ms.path = "mp_rank_00_model_states.pt";
  ms.data_before_expert_parallel = data_before_expert;
  ms.param_shapes.emplace();
  ms.param_shapes->push_back({{"d", {static_cast<int64_t>(kDense)}, kDense}});
  ms.param_shapes->push_back({});
  for (uint64_t l = 0; l < kLocal; ++l)  // EP rank 0 saves its local names
    ms.param_shapes->back().push_back({expert_param(l), {static_cast<int64_t>(kExpert)}, kExpert});
  std::vector<OptimStates> optim(kWorld);
  for (uint64_t r = 0; r < kWorld; ++r) {
    optim[r].path = "rank" + std::to_string(r);
    optim[r].partition_count = {static_cast<int64_t>(kWorld), static_cast<int64_t>(kWorld / kEp)};
    optim[r].expert_groups = {false, true};
    optim[r].fp32_groups = {float_slice(file, layout.dense[r].first, layout.dense[r].second),
                            float_slice(file, layout.experts[r].first, layout.experts[r].second)};
  }
  MoeLayer layer;
  layer.experts_prefix = kPrefix;
  for (uint64_t x = 0; x < kEp * kLocal; ++x)
    layer.experts.push_back({named(expert_param(x), float_slice(file, 0, kExpert))});
  const auto module = splice_experts({named("m.deepspeed_moe.gate.wg.weight", float_slice(file, 0, 1)),
                                      named("d", float_slice(file, 0, kDense))},
                                     {layer});

  const MoeMasters m = assemble_moe_masters(ms, optim, {layer}, module);
  EXPECT_EQ(m.ep_size, static_cast<int>(kEp));
  std::vector<std::string> got;
  for (const auto& t : m.masters) got.push_back(t.name);
  EXPECT_EQ(got, (std::vector<std::string>{expert_param(0), expert_param(1), expert_param(2), expert_param(3),
                                           "d"}));
  for (const auto& t : m.masters) {
    const auto values = read_all(t);
    for (uint64_t j = 0; j < values.size(); ++j) {
      const float want = t.name == "d"
                             ? static_cast<float>(100 + j)
                             : static_cast<float>(1000 * (t.name[std::string(kPrefix).size()] - '0') + j);
      EXPECT_EQ(values[j], want) << t.name << "[" << j << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RankLayouts, MoeMastersTest, ::testing::Values(false, true), [](const auto& info) {
  return info.param ? "DataBeforeExpert" : "ExpertBeforeData";
});

TEST(MoeExperts, SpliceGoesAfterTheGateAndBeforeAResidualMlp) {
  const auto file = testing::SourceFile::of(std::vector<float>(4, 0.0f));
  const auto t = float_slice(file, 0, 1);
  MoeLayer layer;
  layer.experts_prefix = kPrefix;
  layer.experts = {{named(expert_param(0), t)}, {named(expert_param(1), t)}};
  const auto spliced = splice_experts({named("a", t), named("m.deepspeed_moe.gate.wg.weight", t),
                                       named("m.mlp.w", t), named("m.coefficient.weight", t), named("z", t)},
                                      {layer});
  EXPECT_EQ(names(spliced),
            (std::vector<std::string>{"a", "m.deepspeed_moe.gate.wg.weight", expert_param(0), expert_param(1),
                                      "m.mlp.w", "m.coefficient.weight", "z"}));
  // Without the gate the experts follow the MoE module's other weights; without either, they come last.
  EXPECT_EQ(names(splice_experts({named("m.mlp.w", t), named("z", t)}, {layer})),
            (std::vector<std::string>{"m.mlp.w", expert_param(0), expert_param(1), "z"}));
  EXPECT_EQ(names(splice_experts({named("z", t)}, {layer})),
            (std::vector<std::string>{"z", expert_param(0), expert_param(1)}));
}

TEST(MoeExperts, ExpertGroupNotDividingTheWorldIsAFormatError) {
  const auto file = testing::SourceFile::of(std::vector<float>(16, 0.0f));
  ModelStates ms;
  ms.path = "mp_rank_00_model_states.pt";
  ms.param_shapes.emplace();
  ms.param_shapes->push_back({{"d", {2}, 2}});
  ms.param_shapes->push_back({{expert_param(0), {2}, 2}});
  std::vector<OptimStates> optim(3);
  for (auto& r : optim) {
    r.path = "rank";
    r.partition_count = {3, 2};
    r.expert_groups = {false, true};
    r.fp32_groups = {float_slice(file, 0, 2), float_slice(file, 0, 2)};
  }
  MoeLayer layer;
  layer.experts_prefix = kPrefix;
  layer.experts = {{named(expert_param(0), float_slice(file, 0, 2))}};
  EXPECT_THROW(assemble_moe_masters(ms, optim, {layer}, {}), FormatError);
}

}  // namespace
}  // namespace ckptfs::deepspeed
