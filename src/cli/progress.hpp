// A one-line progress bar on stderr, drawn only when stderr is a terminal (and `wanted`: `cat` to a
// terminal draws none over the bytes it prints).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ckptfs::cli {

class Progress {
 public:
  explicit Progress(uint64_t total, bool wanted = true);
  // Ends a bar left unfinished (an error on the way), so that the error's message gets a line of its own.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void set_label(std::string label) { label_ = std::move(label); }
  void advance(uint64_t bytes);
  void finish();

 private:
  void draw();
  uint64_t total_;
  uint64_t done_ = 0;
  bool enabled_;
  bool drawn_ = false;  // a bar is on the terminal's last line, not yet ended by finish()
  std::string label_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace ckptfs::cli
