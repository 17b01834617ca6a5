// Reading the tags of a save dir, shared by the adapters: the root tag must be valid; any other tag that
// fails is left out with its error (or, with OpenOptions::strict, refuses the whole source).
#pragma once

#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/error.hpp"

namespace ckptfs::formats {

// Appends read(t) to cp.tags for every entry t of `tags` (pairs whose .first is the tag name), in order.
// cp.latest must already name the root tag.
template <typename Tags, typename Read>
void read_tags(Checkpoint& cp, const Tags& tags, const OpenOptions& options, Read read) {
  for (const auto& t : tags) {
    try {
      cp.tags.push_back(read(t));
    } catch (const Error& e) {
      if (options.strict || t.first == cp.latest) throw;
      cp.left_out.push_back({t.first, e.what()});
    }
  }
}

}  // namespace ckptfs::formats
