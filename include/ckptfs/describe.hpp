// A JSON description of a checkpoint: `ckptfs inspect --json` and the mount's ckptfs.json.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/layout.hpp"

namespace ckptfs {

// {source, framework, latest, tags: [{name, dir, topology, views: [{path, size, files, reads}], notes,
// [gguf_refused], [tensors]}]} for inspect: `reads` is the bytes a whole read of the view takes from its
// sources; `gguf_refused` why a tag with a model has no gguf/ (the converter's refusal,
// docs/formats/gguf.md).
nlohmann::json describe_checkpoint(const io::Source& source, const Checkpoint& checkpoint, bool with_tensors);
// Why each tag whose views[i] hold no gguf/ file has none (gguf_refusal), for the overload below.
std::vector<std::optional<std::string>> gguf_refusals(const io::Source& source, const Checkpoint& checkpoint,
                                                      const std::vector<std::vector<ViewFile>>& views,
                                                      const ShardOptions& shards = {},
                                                      const GgufOptions& gguf = {});
// The same without `reads`, with every tag's views already built (tag_views of checkpoint.tags[i] in
// views[i]) and their gguf_refusals, so a caller that serves them (ckptfs.json) does not lay them out twice.
nlohmann::json describe_checkpoint(const Checkpoint& checkpoint, bool with_tensors,
                                   const std::vector<std::vector<ViewFile>>& views,
                                   const std::vector<std::optional<std::string>>& gguf_refused,
                                   bool with_reads = false);

}  // namespace ckptfs
