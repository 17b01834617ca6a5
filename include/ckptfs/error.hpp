// Errors raised inside ckptfs layers. Every message names the file and what is wrong
// ("path/to/file.pt: truncated zip: central directory ends past end of file"). Exit codes are part of the
// command-line interface (docs/exit-codes.md) and are only chosen at the edge (cli/, fuse/).
#pragma once

#include <stdexcept>
#include <string>

namespace ckptfs {

enum class ExitCode : int {
  ok = 0,
  failure = 1,             // unexpected internal error
  usage = 2,               // bad command line
  source_unreadable = 3,   // source path missing or unreadable, no checkpoint found
  invalid_checkpoint = 4,  // a checkpoint file is corrupt, truncated or inconsistent
  unsupported = 5,         // a valid checkpoint in a layout ckptfs does not merge yet
  mount_failed = 6,        // FUSE mount could not be set up
  output_failed = 7,       // export could not write its output
};

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// A file's content is malformed or inconsistent with the rest of the checkpoint.
struct FormatError : Error {
  explicit FormatError(const std::string& message) : Error(ExitCode::invalid_checkpoint, message) {}
};

// A well-formed checkpoint that ckptfs cannot merge (yet).
struct UnsupportedError : Error {
  explicit UnsupportedError(const std::string& message) : Error(ExitCode::unsupported, message) {}
};

// A source file cannot be opened or read, or changed since it was indexed.
struct SourceError : Error {
  explicit SourceError(const std::string& message) : Error(ExitCode::source_unreadable, message) {}
};

}  // namespace ckptfs
