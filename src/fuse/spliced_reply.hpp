// Replying to a read without copying source bytes through the server's memory: the runs a view left
// unread (catalog::DeferredRun) go to the kernel straight from their source files through
// fuse_reply_data, which splices them (file -> pipe -> /dev/fuse) where the kernel allows it and reads
// them itself otherwise, or straight from the memory holding them (the tiles of transposed tensors).
// Private to src/fuse.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "fuse/operations.hpp"

namespace ckptfs::fuse {

// Replies with `buffer`, whose deferred runs (in order, inside it) are taken from where they are instead:
// their files, or the memory holding them (a reply of memory alone is one writev over it).
// Throws SourceError before replying when a run's file cannot be opened again or has changed since the
// mount (its open descriptor checked once per file: libfuse would otherwise send a short reply, or the
// new bytes, without telling anyone). Once it has replied it returns what went wrong, empty when
// nothing did: the reply could not be sent (libfuse then answered the request with that error, or the
// kernel no longer waits for it), or a file changed while it was spliced from, so the reply may have
// come back short.
std::string reply_with_runs(fuse_req_t req, std::span<const std::byte> buffer,
                            const std::vector<catalog::DeferredRun>& runs);

}  // namespace ckptfs::fuse
