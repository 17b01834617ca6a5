#include "formats/dtensor.hpp"

#include <gtest/gtest.h>

namespace ckptfs::formats {
namespace {

using Sizes = std::vector<int64_t>;

// The pieces torch.chunk(n, k) gives, as (offset, size) along the sharded dim, for every coordinate.
std::vector<std::pair<int64_t, int64_t>> pieces(int64_t n, int64_t k) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t c = 0; c < k; ++c) {
    const auto box = local_box({n, 5}, {{false, 0}}, {k}, {c});
    EXPECT_EQ(box.sizes[1], 5);
    out.emplace_back(box.offsets[0], box.sizes[0]);
  }
  return out;
}

TEST(DTensorLocalBox, ShardFollowsTorchChunkSizes) {
  using P = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(pieces(131, 2), (P{{0, 66}, {66, 65}}));
  EXPECT_EQ(pieces(14, 4), (P{{0, 4}, {4, 4}, {8, 4}, {12, 2}}));
  EXPECT_EQ(pieces(42, 4), (P{{0, 11}, {11, 11}, {22, 11}, {33, 9}}));
  EXPECT_EQ(pieces(3, 4), (P{{0, 1}, {1, 1}, {2, 1}, {3, 0}}));  // an empty last shard
  EXPECT_EQ(pieces(1, 2), (P{{0, 1}, {1, 0}}));
  EXPECT_EQ(pieces(5, 4), (P{{0, 2}, {2, 2}, {4, 1}, {5, 0}}));
}

TEST(DTensorLocalBox, ShardOnDimOneAndReplicatedMeshDims) {
  // FSDP2 Shard(1) of a [131, 32] embedding over 2 ranks
  auto box = local_box({131, 32}, {{false, 1}}, {2}, {1});
  EXPECT_EQ(box.offsets, (Sizes{0, 16}));
  EXPECT_EQ(box.sizes, (Sizes{131, 16}));
  // HSDP: (Replicate(), Shard(0)) on ddp 2 x fsdp 2: the ddp coordinate does not move the box
  for (int64_t ddp = 0; ddp < 2; ++ddp) {
    box = local_box({88, 32}, {{true, 0}, {false, 0}}, {2, 2}, {ddp, 1});
    EXPECT_EQ(box.offsets, (Sizes{44, 0}));
    EXPECT_EQ(box.sizes, (Sizes{44, 32}));
  }
  // two mesh dims sharding one tensor dim: the second splits the first's piece
  box = local_box({10}, {{false, 0}, {false, 0}}, {2, 2}, {1, 1});
  EXPECT_EQ(box.offsets, (Sizes{8}));
  EXPECT_EQ(box.sizes, (Sizes{2}));
}

TEST(DTensorMeshCoordinate, RowMajorOverTheMesh) {
  EXPECT_EQ(mesh_coordinate(3, {4}), (Sizes{3}));
  EXPECT_EQ(mesh_coordinate(2, {2, 2}), (Sizes{1, 0}));
  EXPECT_EQ(mesh_coordinate(5, {2, 3}), (Sizes{1, 2}));
}

TEST(DTensorPlacementString, AsTorchPrintsThem) {
  EXPECT_EQ(placement_string({{true, 0}, {false, 1}}), "R,S(1)");
}

}  // namespace
}  // namespace ckptfs::formats
