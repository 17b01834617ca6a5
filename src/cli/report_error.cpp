#include <fmt/format.h>

#include <new>

#include "ckptfs/error.hpp"
#include "cli/commands.hpp"

namespace ckptfs::cli {

int report_error(const std::exception& e) {
  if (const auto* err = dynamic_cast<const Error*>(&e)) {
    fmt::print(stderr, "ckptfs: {}\n", err->what());
    return static_cast<int>(err->code());
  }
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    fmt::print(stderr, "ckptfs: out of memory\n");
    return static_cast<int>(ExitCode::failure);
  }
  fmt::print(stderr, "ckptfs: internal error: {}\n", e.what());
  return static_cast<int>(ExitCode::failure);
}

}  // namespace ckptfs::cli
