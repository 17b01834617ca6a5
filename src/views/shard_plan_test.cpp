// SIZE parsing and the split of sharded safetensors views against what huggingface_hub's
// parse_size_to_int / split_state_dict_into_shards_factory give for the same input (values worked out by
// hand from their source: transformers 5.12's save_pretrained, huggingface_hub 1.23).
#include <gtest/gtest.h>

#include <numeric>
#include <stdexcept>

#include "ckptfs/sharding.hpp"
#include "views/test_catalog.hpp"

namespace ckptfs::views {
namespace {

using testing::read_file;
using testing::TensorSpec;
using testing::TestCatalog;

TEST(ShardSize, DecimalUnitsAsHuggingFaceHubParsesThem) {
  EXPECT_EQ(parse_shard_size("5GB"), 5'000'000'000u);
  EXPECT_EQ(parse_shard_size("500MB"), 500'000'000u);
  EXPECT_EQ(parse_shard_size("60KB"), 60'000u);
  EXPECT_EQ(parse_shard_size("2TB"), 2'000'000'000'000u);
  EXPECT_EQ(parse_shard_size("50GB"), kDefaultShardSize);
  // the unit is upper-cased, the number stripped and read as a float, the product truncated
  EXPECT_EQ(parse_shard_size(" 5 gb "), 5'000'000'000u);
  EXPECT_EQ(parse_shard_size("1.5GB"), 1'500'000'000u);
  EXPECT_EQ(parse_shard_size("0.1KB"), 100u);   // 0.1 * 1000 = 100.00000000000001
  EXPECT_EQ(parse_shard_size("0.0015KB"), 1u);  // 1.5 bytes, truncated
  EXPECT_EQ(parse_shard_size("1e-4KB"), 0u);    // 0.1 bytes
  EXPECT_EQ(parse_shard_size(".5MB"), 500'000u);
  EXPECT_EQ(parse_shard_size("2.MB"), 2'000'000u);
  EXPECT_EQ(parse_shard_size("1e3MB"), 1'000'000'000u);
  EXPECT_EQ(parse_shard_size("5Gb"), 5'000'000'000u);  // bytes: parse_size_to_int upper-cases "b"
}

TEST(ShardSize, BinaryUnitsAndPlainBytes) {
  EXPECT_EQ(parse_shard_size("512MiB"), 512u << 20);
  EXPECT_EQ(parse_shard_size("2gib"), uint64_t{2} << 30);
  EXPECT_EQ(parse_shard_size("60KiB"), 60u << 10);
  EXPECT_EQ(parse_shard_size("123456"), 123456u);
  EXPECT_EQ(parse_shard_size("0"), 0u);
  EXPECT_EQ(parse_shard_size("18446744073709551615"), UINT64_MAX);
}

TEST(ShardSize, NotASize) {
  for (const char* bad : {"",
                          " ",
                          "GB",
                          "5B",
                          "5 G",
                          "5XB",
                          "-5GB",
                          "+-5GB",
                          "inf GB",
                          "nanKB",
                          "1_000KB",
                          "0x10MB",
                          "1.5GiB",
                          "5e",
                          "5eGB",
                          "1e400GB",
                          "1e8TB",
                          "18446744073709551616",
                          "17179869184GiB",
                          "5 GB GB",
                          "5PB"})
    EXPECT_THROW(parse_shard_size(bad), std::invalid_argument) << bad;
  try {
    parse_shard_size("5XB");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'5XB' is not a size"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("KB, MB, GB, TB"), std::string::npos) << e.what();
  }
}

// A catalog of U8 tensors t0, t1, ... of the given byte sizes.
TestCatalog sized(const std::vector<int64_t>& sizes) {
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < sizes.size(); ++i) specs.push_back({"t" + std::to_string(i), DType::U8, {sizes[i]}});
  return TestCatalog(specs);
}

using Shards = std::vector<std::vector<size_t>>;

// The shards of a state dict in catalog order.
Shards plan(const TestCatalog& tc, uint64_t max_shard_size) {
  std::vector<size_t> order(tc.catalog()->tensors.size());
  std::iota(order.begin(), order.end(), 0);
  return plan_shards(*tc.catalog(), order, max_shard_size);
}

TEST(ShardPlan, SplitsInStateDictOrderWithoutPacking) {
  // huggingface_hub's own example: 10GB limit, [6, 6, 2, 6, 2, 2] -> [6], [6+2], [6+2+2]
  EXPECT_EQ(plan(sized({6, 6, 2, 6, 2, 2}), 10), (Shards{{0}, {1, 2}, {3, 4, 5}}));
  // exactly full is not over
  EXPECT_EQ(plan(sized({4, 6, 10, 1}), 10), (Shards{{0, 1}, {2}, {3}}));
  // everything fits: one shard (save_pretrained then writes model.safetensors)
  EXPECT_EQ(plan(sized({1, 2, 3}), 6), (Shards{{0, 1, 2}}));
  EXPECT_EQ(plan(sized({}), 6), Shards{});
}

TEST(ShardPlan, ATensorOverTheLimitGetsItsOwnShardBeforeTheOneBeingFilled) {
  EXPECT_EQ(plan(sized({3, 12, 4, 5}), 10), (Shards{{1}, {0, 2}, {3}}));
  // a limit of 0: every tensor alone, but empty tensors join the shard being filled
  EXPECT_EQ(plan(sized({0, 2, 0, 3}), 0), (Shards{{1}, {3}, {0, 2}}));
}

TEST(ShardPlan, InTheOrderOfTheModelsStateDict) {
  EXPECT_EQ(plan_shards(*sized({6, 6, 2, 6, 2, 2}).catalog(), std::vector<size_t>{5, 4, 3, 2, 1, 0}, 10),
            (Shards{{5, 4, 3}, {2, 1}, {0}}));
  // fp32 masters listed in the optimizer's order, split in the model's
  const TestCatalog model(
      {{"embed", DType::BF16, {4}}, {"layer.w", DType::BF16, {4}}, {"norm", DType::BF16, {4}}});
  const TestCatalog fp32({{"norm", DType::F32, {4}},
                          {"extra", DType::F32, {1}},
                          {"embed", DType::F32, {4}},
                          {"layer.w", DType::F32, {4}},
                          {"extra2", DType::F32, {1}}});
  EXPECT_EQ(state_dict_order(*fp32.catalog(), *model.catalog()), (std::vector<size_t>{2, 3, 0, 1, 4}));
}

TEST(ShardPlan, FileNames) {
  EXPECT_EQ(shard_file_name(0, 3), "model-00001-of-00003.safetensors");
  EXPECT_EQ(shard_file_name(99998, 123456), "model-99999-of-123456.safetensors");
}

TEST(ShardedSafetensors, ShardsAndIndexAsSavePretrainedWritesThem) {
  const TestCatalog tc({{"model.norm.weight", DType::F32, {4}},       // 16 bytes
                        {"model.embed.weight", DType::BF16, {3, 4}},  // 24
                        {"lm_head.weight", DType::BF16, {2, 4}},      // 16
                        {"z\xc3\xa9", DType::F16, {2}}});             // 4, a non-ASCII name
  const auto files = make_sharded_safetensors(tc.catalog(), *tc.catalog(), 30);
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files[0].name, "model-00001-of-00003.safetensors");
  EXPECT_EQ(files[1].name, "model-00002-of-00003.safetensors");
  EXPECT_EQ(files[2].name, "model-00003-of-00003.safetensors");
  EXPECT_EQ(files[3].name, "model.safetensors.index.json");
  // each shard: the safetensors file of its tensors alone
  const std::vector<std::vector<size_t>> members = {{0}, {1}, {2, 3}};
  for (size_t s = 0; s < 3; ++s) {
    const auto alone = make_safetensors(tc.catalog(), members[s]);
    ASSERT_EQ(files[s].file->size(), alone->size()) << s;
    EXPECT_EQ(read_file(*files[s].file, 0, alone->size()), read_file(*alone, 0, alone->size())) << s;
  }
  // json.dumps(index, indent=2, sort_keys=True) + "\n", non-ASCII escaped as \uXXXX
  EXPECT_EQ(read_file(*files[3].file, 0, files[3].file->size()),
            "{\n"
            "  \"metadata\": {\n"
            "    \"total_parameters\": 26,\n"
            "    \"total_size\": 60\n"
            "  },\n"
            "  \"weight_map\": {\n"
            "    \"lm_head.weight\": \"model-00003-of-00003.safetensors\",\n"
            "    \"model.embed.weight\": \"model-00002-of-00003.safetensors\",\n"
            "    \"model.norm.weight\": \"model-00001-of-00003.safetensors\",\n"
            "    \"z\\u00e9\": \"model-00003-of-00003.safetensors\"\n"
            "  }\n"
            "}\n");
}

TEST(ShardedSafetensors, OneShardIsTheSingleFile) {
  const TestCatalog tc({{"a", DType::F32, {4}}, {"b", DType::F32, {4}}});
  const auto files = make_sharded_safetensors(tc.catalog(), *tc.catalog(), 32);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].name, "model.safetensors");
  const auto single = make_safetensors(tc.catalog());
  EXPECT_EQ(read_file(*files[0].file, 0, single->size()), read_file(*single, 0, single->size()));
}

}  // namespace
}  // namespace ckptfs::views
