// torch.distributed.tensor.DTensor values of a torch.save file, read as data: what a rank's shard is (its
// local tensor) and where it sits in the global tensor (placements over the device mesh). The pickle is
// `_rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor, (DTensor, dtype, size, stride, ...),
// (None, {'_local_tensor': tensor, '_spec': DTensorSpec(mesh, placements, tensor_meta, ...)}))`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/torch.hpp"
#include "formats/pickle_access.hpp"

namespace ckptfs::formats {

// One mesh dimension's placement: Shard(dim) splits tensor dim `dim` in torch.chunk pieces over the mesh
// dimension; Replicate gives every coordinate the whole extent.
struct Placement {
  bool replicate = false;
  int64_t dim = 0;  // Shard only
  bool operator==(const Placement&) const = default;
};

struct DTensorShard {
  torch::SourceTensor local;
  std::vector<int64_t> global_shape;
  std::vector<Placement> placements;  // one per mesh dimension
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_dim_names;
  std::optional<std::vector<int64_t>> coordinate;  // this rank's mesh coordinate, when pickled
};

// The DTensor `field` holds, or nullopt when it holds something else. Throws FormatError naming the file
// and key when it is a DTensor whose spec cannot be read, or with a placement other than Shard/Replicate
// (Partial, _StridedShard), UnsupportedError for those.
std::optional<DTensorShard> as_dtensor(const Field& field);

// "S(1)", "R": placements as torch prints them.
std::string placement_string(const std::vector<Placement>& placements);

// "ddp=2 x fsdp=2": a mesh's dimensions, named where names were saved.
std::string mesh_string(const std::vector<int64_t>& shape, const std::vector<std::string>& names);

// The box [offset, offset + sizes) of the global tensor that mesh coordinate `coordinate` holds: Shard
// placements applied in mesh-dimension order, each split in torch.chunk sizes (ceil(n / k) elements per
// piece, the last pieces short or empty).
struct LocalBox {
  std::vector<int64_t> offsets, sizes;
};
LocalBox local_box(const std::vector<int64_t>& global_shape, const std::vector<Placement>& placements,
                   const std::vector<int64_t>& mesh_shape, const std::vector<int64_t>& coordinate);

// The number of ranks a mesh of `shape` spans, or `cap` + 1 when it is more than `cap` (whatever sizes were
// pickled: no overflow).
int64_t mesh_ranks(const std::vector<int64_t>& shape, int64_t cap);

// `rank` (row-major over the mesh, as init_device_mesh numbers it) as a mesh coordinate.
std::vector<int64_t> mesh_coordinate(int64_t rank, const std::vector<int64_t>& mesh_shape);

}  // namespace ckptfs::formats
