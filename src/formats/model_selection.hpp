// Which tensors of a nested training state dict are the model (DCP checkpoints, lone torch.save files):
// the 'model' subtree with that prefix removed, or, when there is none, every tensor outside the
// training-state keys. The rule and the key list are documented in docs/formats/dcp.md.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ckptfs/catalog.hpp"

namespace ckptfs::formats {

// A tensor of a nested state dict and the keys leading to it (str keys as they are, list indexes as
// decimal text).
struct StateEntry {
  std::vector<std::string> path;
  catalog::TensorRef tensor;
};

// The model's tensors in their saved dtypes, named by their joined path (minus the 'model' key), in
// state-dict order. Throws FormatError naming `where` when two tensors get one name.
std::shared_ptr<catalog::Catalog> select_model(const std::vector<StateEntry>& entries,
                                               const std::filesystem::path& where);

// The same tensors with float16, bfloat16 and the float8 kinds upcast to float32, exactly (the fp32/ views).
std::shared_ptr<catalog::Catalog> upcast_to_fp32(const catalog::Catalog& model);

}  // namespace ckptfs::formats
