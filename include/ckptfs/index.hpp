// The index cache: what indexing parsed from a checkpoint (catalogs, universal plans, state values,
// side files) kept on disk as an LZ4 frame with its content checksum, so that mounting an unchanged
// checkpoint again reads no pickle (on Lustre, GPFS or NFS every pickle read costs milliseconds). An index is
// used only when every source file still has the identity it had (path, device, inode, size, mtime, ctime)
// and the directories and control files that decide the tags are unchanged; otherwise, or when the index is
// damaged or was written by another ckptfs build (its GNU build id), the checkpoint is parsed again and the
// index rewritten (docs/mount.md).
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "ckptfs/checkpoint.hpp"

namespace ckptfs::index {

// $XDG_CACHE_HOME/ckptfs, else $HOME/.cache/ckptfs; nullopt when neither variable is set.
std::optional<std::filesystem::path> default_cache_dir();

struct Opened {
  Checkpoint checkpoint;
  bool from_index = false;
  std::filesystem::path index_file;  // where the index is (or would be); empty when the cache is off
  std::string parsed_because;        // why the index was not used, when it was looked for
  std::string key;                   // what the index is written for; empty without a cache or a build id
  io::SourcePtr source;              // what it was opened from
};

// open_checkpoint, through the index cache in `cache_dir` (nullopt: no cache). A parsed checkpoint's index
// is not written here: save_index does it, once the mount is live, so that a first mount is not slower
// than a mount without the cache.
Opened open_indexed(io::SourcePtr source, const OpenOptions& options,
                    const std::optional<std::filesystem::path>& cache_dir);

// Writes the index of a checkpoint that open_indexed parsed; nothing when it came from the index or the
// cache is off. Best effort, never throws: a read-only or full cache dir only costs the next mount a
// parse, and the returned warning (empty when written) says why. Reads `opened.checkpoint` only (and the
// state of its paths, through `opened.source`), so it may run while the mount serves the same checkpoint.
std::string save_index(const Opened& opened);

// Parses `source` and writes its index into `cache_dir` (`ckptfs index`); returns the index file.
// Throws what open_checkpoint throws, and Error(output_failed) (exit 7) when the index cannot be written.
std::filesystem::path write_index(const io::Source& source, const OpenOptions& options,
                                  const std::filesystem::path& cache_dir);

}  // namespace ckptfs::index
