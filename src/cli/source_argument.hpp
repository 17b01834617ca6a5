// SRC as every command takes it: a local path, or s3://BUCKET/PREFIX, listed once here with a client
// configured from the command line's S3 options and the AWS environment (s3::resolve_config).
#pragma once

#include <filesystem>
#include <string>

#include "ckptfs/s3.hpp"
#include "io/runtime.hpp"

namespace ckptfs::cli {

// A local SRC made absolute (the daemon runs in "/", and sources are re-checked by path), or the
// object-store source listed once (Runtime::open_remote): the handle the command passes to what reads it.
// Throws SourceError (exit 3) naming the URL and the S3 error code when the store refuses the listing or
// holds nothing under the prefix. Its files read through `runtime`'s caches (an object through a block cache
// of its own).
io::SourcePtr open_source(const std::string& text, const s3::Options& options, io::Runtime& runtime);

}  // namespace ckptfs::cli
