// A JSON description of a checkpoint: `ckptfs inspect --json` and the mount's ckptfs.json.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/layout.hpp"

namespace ckptfs {

// {source, framework, latest, tags: [{name, dir, topology, views: [{path, size, files, reads}], notes,
// [tensors]}]} for inspect: `reads` is the bytes a whole read of the view takes from its sources.
nlohmann::json describe_checkpoint(const Checkpoint& checkpoint, bool with_tensors);
// The same without `reads`, with every tag's views already built (tag_views of checkpoint.tags[i] in
// views[i]), so a caller that serves them (ckptfs.json) does not lay them out twice.
nlohmann::json describe_checkpoint(const Checkpoint& checkpoint, bool with_tensors,
                                   const std::vector<std::vector<ViewFile>>& views, bool with_reads = false);

}  // namespace ckptfs
