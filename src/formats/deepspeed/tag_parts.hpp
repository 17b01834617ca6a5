// What the files of one DeepSpeed tag (or one rank of it) contribute, as its layout's reader finds them
// (layout_readers.hpp), before tag_catalogs lays out the catalogs.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "ckptfs/checkpoint.hpp"
#include "ckptfs/pickle.hpp"
#include "formats/deepspeed/state_files.hpp"
#include "formats/deepspeed/universal_state.hpp"

namespace ckptfs::deepspeed {

// A DeepSpeed tag's topology as its readers find it: the generic one and the ZeRO stage (DeepSpeedTag's).
struct DeepSpeedTopology : Topology {
  int zero_stage = 0;
};

// What one tag contributes before the catalogs are laid out.
struct TagParts {
  std::vector<NamedTensor> module;  // weights as the model holds them (model view order)
  std::set<std::string> buffers;
  std::vector<catalog::LogicalTensor> frozen;  // explicit frozen params (ZeRO-2/3); else derived from module
  bool frozen_from_module = true;
  std::vector<catalog::LogicalTensor> trainable;  // fp32 masters in param_shapes order
  std::vector<std::pair<std::string, std::string>> aliases;
  bool masters_known = true;  // false: no partitioned optimizer state names the masters
  // Universal checkpoint parts: per-parameter state aligned with `trainable`, the global optimizer state
  // (with the catalog of its tensors) and the model-state files ds_to_universal copies.
  std::optional<OptimizerState> optimizer;
  std::string no_universal;  // why the tag has no universal/ (when optimizer is empty)
  pickle::ValuePtr optimizer_state;
  std::shared_ptr<catalog::Catalog> optimizer_state_tensors = std::make_shared<catalog::Catalog>();
  std::vector<std::filesystem::path> model_state_copies;
  // A pipeline universal checkpoint has no layer files: the model view is the masters in this dtype.
  std::optional<DType> model_from_masters;
};

}  // namespace ckptfs::deepspeed
