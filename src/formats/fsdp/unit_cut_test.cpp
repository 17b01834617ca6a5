#include "formats/fsdp/unit_cut.hpp"

#include <gtest/gtest.h>

namespace ckptfs::formats::fsdp {
namespace {

FlatUnit unit(std::string module, int64_t numel, std::vector<OrigPiece> pieces = {}) {
  FlatUnit u;
  u.pieces = std::move(pieces);
  u.key = module.empty() ? "_flat_param" : module + "._flat_param";
  u.module = std::move(module);
  u.numel = numel;
  return u;
}

std::vector<HfParameter> parameters(const std::vector<std::pair<std::string, std::vector<int64_t>>>& list) {
  std::vector<HfParameter> out;
  for (const auto& [name, shape] : list) out.push_back({name, shape, ""});
  return out;
}

std::vector<CutUnit> cut(const std::vector<FlatUnit>& units, const std::vector<HfParameter>& params,
                         int64_t world) {
  auto result = cut_units(units, params, "", world, "the test's parameters");
  if (auto* why = std::get_if<std::string>(&result)) ADD_FAILURE() << *why;
  return std::get<std::vector<CutUnit>>(result);
}

std::vector<int64_t> firsts(const CutUnit& u) {
  std::vector<int64_t> out;
  for (const auto& p : u.parameters) out.push_back(p.first);
  return out;
}

// The real accelerate save's root unit (mount_tests/fixtures/fsdp-local-real/accelerate_llama_ws2_fp32_orig,
// case.json's live FlatParameter): use_orig_params pads 2 elements before norm and before lm_head so that
// each starts on 16 bytes of float32; the ranks' pieces of the parameters (rank 1's from element 5525) pin it
// down.
TEST(FsdpUnitCut, UseOrigParamsAlignsEachParameterTo16BytesOfItsDtype) {
  const auto units = std::vector{unit("", 11050,
                                      {{"model.embed_tokens.weight", 0, 5502},
                                       {"model.norm.weight", 5504, 21},
                                       {"model.norm.weight", 5525, 21},
                                       {"lm_head.weight", 5548, 5502}})};
  const auto c = cut(units,
                     parameters({{"model.embed_tokens.weight", {131, 42}},
                                 {"model.norm.weight", {42}},
                                 {"lm_head.weight", {131, 42}}}),
                     2);
  EXPECT_EQ(c[0].alignment, 4);
  EXPECT_EQ(c[0].padding, 4);
  EXPECT_EQ(firsts(c[0]), (std::vector<int64_t>{0, 5504, 5548}));
}

// Without use_orig_params the parameters sit back to back (the real FSDP1 save of 8,416 elements).
TEST(FsdpUnitCut, WithoutAlignmentParametersAreContiguous) {
  const auto units = std::vector{unit("", 8416)};
  const auto c = cut(units,
                     parameters({{"model.embed_tokens.weight", {131, 32}},
                                 {"model.norm.weight", {32}},
                                 {"lm_head.weight", {131, 32}}}),
                     2);
  EXPECT_EQ(c[0].alignment, 1);
  EXPECT_EQ(firsts(c[0]), (std::vector<int64_t>{0, 4192, 4224}));
}

// Aligned flat parameters are also padded at the end to divide by the world size.
TEST(FsdpUnitCut, AnAlignedFlatParameterMayEndInWorldSizePadding) {
  const auto units = std::vector{unit("", 16, {{"a", 0, 2}, {"b", 4, 5}, {"c", 12, 3}})};
  const auto c =
      cut(units, parameters({{"a", {2}}, {"b", {5}}, {"c", {3}}}), 4);  // 2, pad 2, 5, pad 3, 3, pad 1
  EXPECT_EQ(c[0].alignment, 4);
  EXPECT_EQ(firsts(c[0]), (std::vector<int64_t>{0, 4, 12}));
  EXPECT_EQ(c[0].padding, 6);
}

// bf16 compute over fp32 storage aligns to 16 bytes of bf16: 8 elements. On 8 ranks a cut aligned to 4 would
// also end within the world-size padding (3, 5, 8 at 0, 4, 12: 20 of 24); the pieces rule it out.
TEST(FsdpUnitCut, MixedPrecisionAlignsToTheComputeDtype) {
  const auto units = std::vector{
      unit("", 24, {{"a", 0, 3}, {"b", 8, 1}, {"b", 9, 3}, {"b", 12, 1}, {"c", 16, 3}, {"c", 19, 5}})};
  const auto c = cut(units, parameters({{"a", {3}}, {"b", {5}}, {"c", {8}}}), 8);  // 0, 8, 16
  EXPECT_EQ(c[0].alignment, 8);
  EXPECT_EQ(firsts(c[0]), (std::vector<int64_t>{0, 8, 16}));
}

// A nested unit holds the parameters below its module; the root unit the rest; a tied parameter is flattened
// once (as its target).
TEST(FsdpUnitCut, NestedUnitsTakeTheirOwnModulesParameters) {
  const std::vector<FlatUnit> units = {unit("model.layers.0", 6), unit("", 7)};
  auto params = parameters({{"model.embed_tokens.weight", {2, 3}},
                            {"model.layers.0.w", {6}},
                            {"model.norm.weight", {1}},
                            {"lm_head.weight", {2, 3}}});
  params.back().tied_to = "model.embed_tokens.weight";
  const auto c = cut(units, params, 1);
  ASSERT_EQ(c.size(), 2U);
  ASSERT_EQ(c[0].parameters.size(), 1U);
  EXPECT_EQ(c[0].parameters[0].name, "model.layers.0.w");
  ASSERT_EQ(c[1].parameters.size(), 2U);
  EXPECT_EQ(c[1].parameters[1].name, "model.norm.weight");
  EXPECT_EQ(c[1].parameters[1].first, 6);
}

TEST(FsdpUnitCut, SizesThatDoNotAddUpSayWhy) {
  const auto units = std::vector{unit("model.layers.0", 100)};
  const auto result = cut_units(units, parameters({{"model.layers.0.w", {6, 6}}}), "", 2, "config.json's X");
  ASSERT_TRUE(std::holds_alternative<std::string>(result));
  EXPECT_NE(std::get<std::string>(result).find("model.layers.0._flat_param"), std::string::npos);
  EXPECT_NE(std::get<std::string>(result).find("36 elements"), std::string::npos);
  const auto orphan = cut_units(units, parameters({{"lm_head.weight", {2}}}), "", 2, "config.json's X");
  ASSERT_TRUE(std::holds_alternative<std::string>(orphan));
  EXPECT_NE(std::get<std::string>(orphan).find("lm_head.weight belongs to no FSDP unit"), std::string::npos);
}

// Units found under a wrapper's prefix (a LightningModule's "model.") cut the layout's names.
TEST(FsdpUnitCut, UnitsUnderAPrefix) {
  const std::vector<FlatUnit> units = {unit("model.model.layers.0", 4), unit("", 2)};
  auto result = cut_units(units, parameters({{"model.embed_tokens.weight", {2}}, {"model.layers.0.w", {4}}}),
                          "model.", 1, "x");
  ASSERT_TRUE(std::holds_alternative<std::vector<CutUnit>>(result));
  EXPECT_EQ(std::get<std::vector<CutUnit>>(result)[0].parameters[0].name, "model.layers.0.w");
}

}  // namespace
}  // namespace ckptfs::formats::fsdp
