// The process-wide cache of open source descriptors behind io::File: least recently used ones are
// closed beyond the limit and reopened on demand.
#pragma once

#include <sys/stat.h>

#include <memory>
#include <utility>

#include "ckptfs/io.hpp"

namespace ckptfs::io {

FileIdentity identity_of(const struct stat& st);

// Opens `path` read-only and returns it with its identity. Throws SourceError naming the path.
std::pair<OpenFdPtr, FileIdentity> open_source(const std::filesystem::path& path);

namespace fd_cache {

// Hands `fd` to the cache as the descriptor of `file` (just opened by File::open).
void insert(const File* file, OpenFdPtr fd);
// The descriptor of `file`, reopened (and checked against its identity) when it was evicted.
OpenFdPtr acquire(const File& file);
// Drops the descriptor of a File being destroyed.
void forget(const File* file);

}  // namespace fd_cache

}  // namespace ckptfs::io
