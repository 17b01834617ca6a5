// Writing a view out of the process (`export`, `cat`): read in fixed-size chunks through the same
// VirtualFile the mount serves, so memory stays at two chunks whatever the view's size.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

#include "ckptfs/error.hpp"
#include "ckptfs/views.hpp"
#include "cli/progress.hpp"

namespace ckptfs::cli {

struct OutputError : Error {
  explicit OutputError(const std::string& message) : Error(ExitCode::output_failed, message) {}
};

// The reader of the output went away (EPIPE: `ckptfs cat ... | head -c 10`).
struct OutputClosed : OutputError {
  using OutputError::OutputError;
};

// Writes the bytes of `file` to `fd` (`output` names it in messages), advancing `progress`. A read that
// fails is rethrown with its code, naming `view` and the bytes asked for (all before them are written);
// a write that fails is an OutputError (OutputClosed for EPIPE).
void stream_view(const views::VirtualFile& file, const std::string& view, int fd, const std::string& output,
                 Progress& progress);

// Throws SourceError naming `view` and the file when a source of `file` no longer has the identity it was
// indexed with (one stat each): after a read, a shard rewritten in place meanwhile (same size) would
// otherwise go unnoticed.
void check_sources_unchanged(const views::VirtualFile& file, const std::string& view);

// stream_view into `path` through `path`.partial, renamed once complete (and `before_rename`, if any,
// returned) and removed on failure: `path` never names a partial file. A `path` that is a device or a FIFO
// (/dev/null) is written in place.
void write_view(const views::VirtualFile& file, const std::string& view, const std::filesystem::path& path,
                Progress& progress, const std::function<void()>& before_rename = {});

// Whether `inner` is `outer` or lies below it, symlinks resolved (ckptfs never writes into its source).
bool is_inside(const std::filesystem::path& inner, const std::filesystem::path& outer);

}  // namespace ckptfs::cli
