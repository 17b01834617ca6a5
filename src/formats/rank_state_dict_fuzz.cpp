// libFuzzer target: a per-rank model file (torch.save zip of a state dict: verl's, FSDP's) with every
// DTensor and ShardedTensor read as data and the box of each DTensor mesh coordinate computed.
#include <cstddef>
#include <cstdint>

#include "ckptfs/error.hpp"
#include "formats/rank_state_dict.hpp"
#include "io/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs;
  const io::FuzzInput input(data, size);
  try {
    const auto archive = torch::TorchArchive::open(input.open());
    for (const auto& [name, value] : formats::root_field(archive).items()) {
      if (formats::as_sharded_tensor(value)) continue;
      const auto shard = formats::as_dtensor(value);
      if (!shard) continue;
      int64_t ranks = 1;
      for (const auto n : shard->mesh_shape) ranks = n > 64 ? 65 : std::min<int64_t>(ranks * n, 65);
      for (int64_t r = 0; r < ranks && ranks <= 64; ++r)
        formats::local_box(shard->global_shape, shard->placements, shard->mesh_shape,
                           formats::mesh_coordinate(r, shard->mesh_shape));
    }
  } catch (const Error&) {
  }
  return 0;
}
