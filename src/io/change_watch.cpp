#include "io/change_watch.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "ckptfs/io_tree.hpp"

namespace ckptfs::io {

namespace fs = std::filesystem;

namespace {

// A save writes its files in a burst: a refresh waits for this much quiet, but no longer than kMostWait.
constexpr std::chrono::milliseconds kQuiet{300};
constexpr std::chrono::milliseconds kMostWait{3000};
// How often a wait looks at its stop token.
constexpr std::chrono::milliseconds kStopCheck{200};

constexpr uint32_t kEvents =
    IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF;

// Filesystems whose other clients' writes send no inotify events here.
std::string shared_filesystem(const fs::path& dir) {
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0) return {};
  switch (static_cast<unsigned long>(st.f_type)) {
    case 0x6969:
      return "NFS";
    case 0x0BD00BD0:
      return "Lustre";
    case 0x47504653:
      return "GPFS";
    case 0x00C36400:
      return "CephFS";
    case 0xFF534D42:
    case 0xFE534D42:
      return "SMB";
    case 0x65735546:
      return "FUSE";
    case 0x01021997:
      return "9p";
    default:
      return {};
  }
}

}  // namespace

ChangeWatch::ChangeWatch(const Source& source, std::chrono::milliseconds interval) : interval_(interval) {
  const fs::path& root = source.root();
  if (source.is_remote()) {
    polling_because_ = "an object store sends no change events";
    return;
  }
  if (const std::string shared = shared_filesystem(root); !shared.empty()) {
    polling_because_ =
        fmt::format("{} is on {}, whose other clients' writes send no inotify events", root.string(), shared);
    return;
  }
  fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd_ < 0) {
    polling_because_ = fmt::format("inotify: {}", std::strerror(errno));
    return;
  }
  watch_tree(root, 0);
}

ChangeWatch::~ChangeWatch() {
  if (fd_ >= 0) ::close(fd_);
}

void ChangeWatch::watch_tree(const fs::path& dir, int depth) {
  if (fd_ < 0) return;
  if (watched_.size() >= kMaxWatches) {
    polling_because_ = fmt::format("more than {} directories to watch", kMaxWatches);
    ::close(fd_);
    fd_ = -1;
    return;
  }
  const int wd = ::inotify_add_watch(fd_, dir.c_str(), kEvents | IN_ONLYDIR);
  if (wd < 0) {
    if (depth == 0) polling_because_ = fmt::format("inotify on {}: {}", dir.string(), std::strerror(errno));
    if (depth == 0 || errno == ENOSPC) {
      ::close(fd_);
      fd_ = -1;
    }
    return;
  }
  watched_[wd] = {dir, depth};
  if (depth >= kDepth) return;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (std::error_code e; entry.is_directory(e) && !entry.is_symlink(e)) watch_tree(entry.path(), depth + 1);
}

bool ChangeWatch::drain() {
  alignas(inotify_event) char buffer[16384];
  bool any = false;
  while (fd_ >= 0) {
    const ssize_t n = ::read(fd_, buffer, sizeof buffer);
    if (n <= 0) return any;
    any = true;
    for (ssize_t at = 0; at < n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
      at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      if (event->mask & IN_IGNORED) {
        watched_.erase(event->wd);
        continue;
      }
      const auto it = watched_.find(event->wd);
      if (it == watched_.end() || event->len == 0 || !(event->mask & IN_ISDIR)) continue;
      if ((event->mask & (IN_CREATE | IN_MOVED_TO)) && it->second.second < kDepth)
        watch_tree(it->second.first / event->name, it->second.second + 1);
    }
  }
  return any;
}

bool ChangeWatch::wait(std::stop_token stop) {
  if (fd_ < 0) {  // polling
    const auto until = std::chrono::steady_clock::now() + interval_;
    while (std::chrono::steady_clock::now() < until) {
      if (stop.stop_requested()) return false;
      std::this_thread::sleep_for(std::min(kStopCheck, interval_));
    }
    return !stop.stop_requested();
  }
  pollfd p{fd_, POLLIN, 0};
  while (!stop.stop_requested()) {
    if (::poll(&p, 1, static_cast<int>(kStopCheck.count())) > 0 && drain()) {
      const auto first = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - first < kMostWait && !stop.stop_requested()) {
        if (fd_ < 0 || ::poll(&p, 1, static_cast<int>(kQuiet.count())) <= 0 || !drain()) break;
      }
      return !stop.stop_requested();
    }
    if (fd_ < 0) return !stop.stop_requested();  // gave up watching (too many dirs): poll from now on
  }
  return false;
}

}  // namespace ckptfs::io
