// Subcommands of the `ckptfs` binary. Each takes its arguments without the subcommand word
// (args[0] is the first argument after it) and returns the process exit code (docs/exit-codes.md).
#pragma once

#include <span>
#include <string>
#include <vector>

namespace ckptfs::cli {

int run_inspect(std::span<const std::string> args);
int run_export(std::span<const std::string> args);
int run_index(std::span<const std::string> args);
int run_cat(std::span<const std::string> args);
// `ckptfs mount SRC MNT ...` and `ckptfs SRC MNT ...`: argv[0] is the program name, argv[1..] are
// SRC MNT and the options (the word "mount" removed).
int run_mount(int argc, char** argv);

// Prints "ckptfs: <message>" on one line to stderr and returns the exit code for the exception.
int report_error(const std::exception& e);

}  // namespace ckptfs::cli
