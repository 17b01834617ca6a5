#include "fuse/read_ahead.hpp"

#include <algorithm>

namespace ckptfs::fuse {

namespace {

// How far from a stream's end a read may start and still continue it: the kernel has several requests of
// one reader in flight at once, and they arrive out of order.
uint64_t slack(uint64_t window) {
  return std::max<uint64_t>(window / 4, 2u << 20);
}

}  // namespace

std::optional<std::pair<uint64_t, uint64_t>> ReadAhead::next(uint64_t offset, uint64_t length,
                                                             uint64_t window, uint64_t step, uint64_t size) {
  const uint64_t end = offset + length;
  const std::lock_guard lock(mutex_);
  ++clock_;
  auto continued = std::find_if(streams_.begin(), streams_.end(), [&](const Stream& s) {
    return offset + slack(window) >= s.read_to && offset <= s.read_to + slack(window);
  });
  if (continued == streams_.end()) {
    auto oldest = std::min_element(streams_.begin(), streams_.end(), [](const Stream& a, const Stream& b) {
      return a.last_used < b.last_used;
    });
    *oldest = Stream{end, end, clock_};
    return std::nullopt;
  }
  Stream& s = *continued;
  s.last_used = clock_;
  s.read_to = std::max(s.read_to, end);
  const uint64_t from = std::max(s.prefetched_to, end), to = std::min(size, end + window);
  if (from >= to || (to - from < step && to < size)) return std::nullopt;
  s.prefetched_to = to;
  return std::pair{from, to - from};
}

OpenFile* OpenFiles::open(uint64_t ino, const views::VirtualFilePtr& file,
                          const std::function<PrefetchWindow()>& window_of) {
  {
    const std::lock_guard lock(mutex_);
    if (auto it = files_.find(ino); it != files_.end()) {
      ++it->second.handles;
      return it->second.file.get();
    }
  }
  views::VirtualFilePtr layout = file->open_layout();
  const PrefetchWindow prefetch = window_of();
  const std::lock_guard lock(mutex_);
  Entry& entry = files_[ino];
  if (!entry.file) entry.file = std::make_unique<OpenFile>(layout ? std::move(layout) : file, prefetch);
  ++entry.handles;
  return entry.file.get();
}

void OpenFiles::release(uint64_t ino) {
  const std::lock_guard lock(mutex_);
  auto it = files_.find(ino);
  if (it == files_.end() || --it->second.handles != 0) return;
  if (it->second.file->streaming) --streaming_;
  files_.erase(it);
}

PrefetchWindow OpenFiles::window_of(const OpenFile& file) {
  if (!file.prefetch.shared) return file.prefetch;
  const std::lock_guard lock(mutex_);
  return file.prefetch.divided_among(streaming_ + (file.streaming ? 0 : 1));
}

void OpenFiles::set_streaming(OpenFile& file, bool on) {
  const std::lock_guard lock(mutex_);
  if (file.streaming == on) return;
  file.streaming = on;
  on ? ++streaming_ : --streaming_;
}

}  // namespace ckptfs::fuse
