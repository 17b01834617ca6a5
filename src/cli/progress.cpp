#include "cli/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

namespace ckptfs::cli {

using Clock = std::chrono::steady_clock;

Progress::Progress(uint64_t total, bool wanted)
    : total_(total),
      enabled_(wanted && ::isatty(STDERR_FILENO) == 1),
      start_(Clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  if (drawn_) fmt::print(stderr, "\n");
}

void Progress::advance(uint64_t bytes) {
  done_ += bytes;
  if (enabled_ && Clock::now() - last_draw_ > std::chrono::milliseconds(200)) draw();
}

void Progress::draw() {
  drawn_ = true;
  last_draw_ = Clock::now();
  const double seconds = std::chrono::duration<double>(last_draw_ - start_).count();
  const double fraction = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(fraction * kWidth);
  fmt::print(stderr, "\r[{:#<{}}{:<{}}] {:5.1f}% {:.2f}/{:.2f} GB {:.0f} MB/s  {:<28}", "", filled, "",
             kWidth - filled, fraction * 100, static_cast<double>(done_) / 1e9,
             static_cast<double>(total_) / 1e9,
             seconds > 0 ? static_cast<double>(done_) / 1e6 / seconds : 0.0, label_);
}

void Progress::finish() {
  if (!enabled_) return;
  draw();
  fmt::print(stderr, "\n");
  drawn_ = false;
}

}  // namespace ckptfs::cli
