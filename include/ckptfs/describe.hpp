// A JSON description of a checkpoint: `ckptfs inspect --json` and the mount's ckptfs.json.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/layout.hpp"

namespace ckptfs {

// {source, framework, latest, tags: [{name, dir, topology, views: [{path, size}], notes, [tensors]}]}
nlohmann::json describe_checkpoint(const Checkpoint& checkpoint, bool with_tensors);
// The same, with every tag's views already built (tag_views of checkpoint.tags[i] in views[i]), so a
// caller that serves them does not lay them out twice.
nlohmann::json describe_checkpoint(const Checkpoint& checkpoint, bool with_tensors,
                                   const std::vector<std::vector<ViewFile>>& views);

}  // namespace ckptfs
