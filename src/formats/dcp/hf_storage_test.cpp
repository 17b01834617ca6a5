// HuggingFaceStorageWriter dirs from hand-written safetensors files: chunks placed by DCP_SHARDING_INFO
// (rows, columns), consolidated files beside sharded/, and the inconsistencies refused with the file named.
#include "formats/dcp/hf_storage.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ckptfs/error.hpp"
#include "io/test_source.hpp"
#include "vfs/test_files.hpp"

namespace ckptfs::dcp {
namespace {

namespace fs = std::filesystem;

struct Chunk {
  std::string fqn;
  std::vector<int64_t> shape;
  std::vector<float> values;
  std::vector<int64_t> offsets;  // DCP_SHARDING_INFO's saved_offsets
};

// A safetensors file of F32 chunks, with DCP_SHARDING_INFO when `sharding_info` (as the writer makes it).
std::string safetensors(const std::vector<Chunk>& chunks, bool sharding_info = true) {
  nlohmann::ordered_json header, info = nlohmann::ordered_json::object();
  std::string data;
  for (const auto& c : chunks) {
    header[c.fqn] = {{"dtype", "F32"},
                     {"shape", c.shape},
                     {"data_offsets", {data.size(), data.size() + 4 * c.values.size()}}};
    data.append(reinterpret_cast<const char*>(c.values.data()), 4 * c.values.size());
    info[c.fqn] = {{"saved_offsets", c.offsets}};
  }
  if (sharding_info) header["__metadata__"] = {{"DCP_SHARDING_INFO", info.dump()}, {"format", "pt"}};
  const std::string text = header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  return out + text + data;
}

std::vector<float> read_all(const catalog::LogicalTensor& t) {
  std::vector<float> out(t.numel());
  catalog::read_tensor(t, 0, std::as_writable_bytes(std::span(out)));
  return out;
}

const catalog::LogicalTensor& model_tensor(const Checkpoint& cp, size_t i) {
  return cp.tags.at(0).catalog(ViewRole::model)->tensors.at(i);
}

std::string open_error(const fs::path& dir) {
  try {
    open_hf_storage(*io::test_source(dir), dir, {});
  } catch (const FormatError& e) {
    return e.what();
  }
  return "no error";
}

// Rank 1 holds rows 0-1 of w (3x2) and columns 0-1 of v (2x3), rank 2 the rest.
void write_two_ranks(const testing::TempDir& dir) {
  dir.write("shard-00001-model-00001-of-00001.safetensors",
            safetensors({{"w", {2, 2}, {1, 2, 3, 4}, {0, 0}}, {"v", {2, 2}, {10, 11, 13, 14}, {0, 0}}}));
  dir.write("shard-00002-model-00001-of-00001.safetensors",
            safetensors({{"w", {1, 2}, {5, 6}, {2, 0}}, {"v", {2, 1}, {12, 15}, {0, 2}}}));
}

TEST(HfStorage, ChunksOfRanksMergeIntoGlobalTensors) {
  testing::TempDir dir;
  write_two_ranks(dir);
  dir.write("config.json", "{}");
  ASSERT_TRUE(is_hf_storage_dir(*io::test_source(dir.path()), dir.path()));
  const Checkpoint cp = open_hf_storage(*io::test_source(dir.path()), dir.path(), {});
  const Tag& tag = cp.tags.at(0);
  EXPECT_EQ(tag.topology.dp, 2);
  EXPECT_NE(tag.format.find("distributed shards"), std::string::npos) << tag.format;
  EXPECT_EQ(model_tensor(cp, 0).name, "w");  // DCP_SHARDING_INFO's order
  EXPECT_EQ(model_tensor(cp, 0).shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(read_all(model_tensor(cp, 0)), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(model_tensor(cp, 1).shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(read_all(model_tensor(cp, 1)), (std::vector<float>{10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(tag.side_files, (std::vector<fs::path>{dir.path() / "config.json"}));
}

TEST(HfStorage, ConsolidatedFilesWinOverSharded) {
  testing::TempDir dir;
  fs::create_directory(dir.path() / "sharded");
  dir.write("sharded/shard-00001-model-00001-of-00001.safetensors", "not read");
  dir.write("model-00001-of-00001.safetensors", safetensors({{"w", {3}, {7, 8, 9}, {0}}}, false));
  dir.write("model.safetensors.index.json",
            R"({"metadata": {"total_size": 12}, "weight_map": {"w": "model-00001-of-00001.safetensors"}})");
  const Checkpoint cp = open_hf_storage(*io::test_source(dir.path()), dir.path(), {});
  EXPECT_EQ(read_all(model_tensor(cp, 0)), (std::vector<float>{7, 8, 9}));
  EXPECT_NE(cp.tags[0].format.find("consolidated"), std::string::npos);
  EXPECT_EQ(cp.tags[0].notes.size(), 1u);
  EXPECT_EQ(cp.tags[0].side_files, (std::vector<fs::path>{dir.path() / "model.safetensors.index.json"}));
}

TEST(HfStorage, ShardsAloneInShardedAreRead) {
  testing::TempDir dir;
  fs::create_directory(dir.path() / "sharded");
  testing::TempDir inner;
  write_two_ranks(inner);
  for (const auto& e : fs::directory_iterator(inner.path())) fs::copy(e.path(), dir.path() / "sharded");
  const Checkpoint cp = open_hf_storage(*io::test_source(dir.path()), dir.path(), {});
  EXPECT_EQ(read_all(model_tensor(cp, 0)), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_NE(cp.tags[0].format.find("sharded/, not consolidated"), std::string::npos);
}

TEST(HfStorage, InconsistentShardsAreRefusedNamingTheFile) {
  {
    testing::TempDir dir;  // rank 2's rows of w overlap rank 1's
    dir.write("shard-00001-model-00001-of-00001.safetensors",
              safetensors({{"w", {2, 2}, {1, 2, 3, 4}, {0, 0}}}));
    dir.write("shard-00002-model-00001-of-00001.safetensors",
              safetensors({{"w", {2, 2}, {5, 6, 7, 8}, {1, 0}}}));
    const std::string e = open_error(dir.path());
    EXPECT_NE(e.find("overlap"), std::string::npos) << e;
    EXPECT_NE(e.find("shard-00002-model-00001-of-00001.safetensors"), std::string::npos) << e;
  }
  {
    testing::TempDir dir;  // rows 2-3 of w in no chunk
    dir.write("shard-00001-model-00001-of-00001.safetensors",
              safetensors({{"w", {2, 2}, {1, 2, 3, 4}, {0, 0}}}));
    dir.write("shard-00002-model-00001-of-00001.safetensors", safetensors({{"w", {1, 2}, {5, 6}, {3, 0}}}));
    EXPECT_NE(open_error(dir.path()).find("in no chunk"), std::string::npos) << open_error(dir.path());
  }
  {
    testing::TempDir dir;  // rank 1's file lost
    dir.write("shard-00002-model-00001-of-00001.safetensors", safetensors({{"w", {1, 2}, {5, 6}, {2, 0}}}));
    EXPECT_NE(open_error(dir.path()).find("shard-00001-model-*.safetensors is missing"), std::string::npos);
  }
  {
    testing::TempDir dir;  // the sharding info gives one offset for a 2-D chunk
    dir.write("shard-00001-model-00001-of-00001.safetensors",
              safetensors({{"w", {2, 2}, {1, 2, 3, 4}, {0}}}));
    EXPECT_NE(open_error(dir.path()).find("shard-00001-model-00001-of-00001.safetensors: DCP_SHARDING_INFO"),
              std::string::npos);
  }
  {
    testing::TempDir dir;  // offsets far past any real tensor: refused before anything is sized from them
    dir.write("shard-00001-model-00001-of-00001.safetensors",
              safetensors({{"w", {2, 2}, {1, 2, 3, 4}, {0, 0}}}));
    dir.write("shard-00002-model-00001-of-00001.safetensors",
              safetensors({{"w", {1, 2}, {5, 6}, {int64_t{1} << 40, int64_t{1} << 40}}}));
    EXPECT_NE(open_error(dir.path()).find("too large"), std::string::npos) << open_error(dir.path());
  }
  {
    testing::TempDir dir;  // the index names a file that is not there
    dir.write("model-00001-of-00002.safetensors", safetensors({{"w", {3}, {7, 8, 9}, {0}}}, false));
    dir.write(
        "model.safetensors.index.json",
        R"({"weight_map": {"w": "model-00001-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"}})");
    const std::string e = open_error(dir.path());
    EXPECT_NE(e.find("model.safetensors.index.json"), std::string::npos) << e;
    EXPECT_NE(e.find("model-00002-of-00002.safetensors, which is missing"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace ckptfs::dcp
