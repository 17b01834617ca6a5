// A JSON description of a checkpoint: `ckptfs inspect --json` and the mount's ckptfs.json.
#pragma once

#include <nlohmann/json.hpp>

#include "ckptfs/checkpoint.hpp"

namespace ckptfs {

// {source, framework, latest, tags: [{name, dir, topology, views: [{path, size}], notes, [tensors]}]}
nlohmann::json describe_checkpoint(const Checkpoint& checkpoint, bool with_tensors);

}  // namespace ckptfs
