#include "fuse/read_ahead.hpp"

#include <algorithm>
#include <vector>

#include "ckptfs/io.hpp"

namespace ckptfs::fuse {

namespace {

// How far from a stream's end a read may start and still continue it: the kernel has several requests of
// one reader in flight at once, and they arrive out of order.
uint64_t slack(uint64_t window) {
  return std::max<uint64_t>(window / 4, 2u << 20);
}

// What the kernel's readahead and the FUSE requests in flight may hold of the block cache (prefetch_window).
constexpr uint64_t kRemoteReadsInFlight = uint64_t{16} << 20;

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

// How far ahead of a sequential reader prefetch reaches, and the least it refills that window by. A
// prefetch hands each source file the ranges behind its step of the view: a step per read would be a
// slice of one read, and a quarter of the window ahead leaves it three quarters full.
// Over an object store each range is a GET, whose cost is per request (the bench's gateway spends about
// 1.2 ms of CPU on each, whatever its size: 1,600 GETs of 64 KiB cost it more than 64 of 17 MB): a ZeRO-3
// view's step is a slice of every rank object, so the window grows with the objects until each step is a
// GET of io::kRemoteRequestBytes per object, as far as the block cache's memory allows: the step before, half
// read, stays while the next arrives, so the window and half again must fit beside the reads in flight
// (kRemoteReadsInFlight, or half of a cache of twice that or less: the kernel's readahead and FUSE
// requests, each rounded out; a window of two thirds of a 32 MiB cache refetched a fifth of an 8-rank
// bf16 view). Each range's end is rounded up to the next request (ExtentFile::prefetch), half a request per
// object on average held beyond the window: that comes off it, down to a quarter of it (at 64 ranks a window
// left whole made the prefetches of the objects asked for last fail for want of memory, every step: those
// objects were read in 40-odd small GETs each). The files streaming at once share it
// (OpenFiles::window_of); each refills by halves. Both bounds are source bytes: a bf16 view of fp32 masters
// reads two for each byte it serves.
PrefetchWindow prefetch_window(const vfs::Node& node, uint64_t prefetch_bytes, uint64_t remote_cache_bytes) {
  if (!io::reads_objects(node.sources)) return {prefetch_bytes, prefetch_bytes / 4};
  const uint64_t wanted = std::max(2 * prefetch_bytes, 2 * io::kRemoteRequestBytes * node.sources.size());
  const uint64_t room = remote_cache_bytes > 2 * kRemoteReadsInFlight
                            ? remote_cache_bytes - kRemoteReadsInFlight
                            : remote_cache_bytes / 2;
  uint64_t source_window = std::min(wanted, room / 3 * 2);
  source_window -= std::min(source_window / 4 * 3, io::kRemoteRequestBytes / 2 * node.sources.size());
  std::vector<catalog::Piece> runs;
  node.file->append_source_runs(runs);
  const uint64_t source_bytes = views::distinct_source_bytes(std::move(runs));
  const uint64_t window =
      source_bytes > node.size()
          ? static_cast<uint64_t>(static_cast<long double>(source_window) * node.size() / source_bytes)
          : source_window;
  return {window, window / 2, true};
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

void OpenFiles::prefetch_for_read(OpenFile& file, uint64_t start, uint64_t length, uint64_t file_size) {
  const PrefetchWindow window = window_of(file);
  const auto ahead = file.read_ahead.next(start, length, window.window, window.step, file_size);
  if (!ahead) return;
  if (window.shared) set_streaming(file, ahead->first + ahead->second < file_size);
  file.content->prefetch(ahead->first, ahead->second);
}

}  // namespace ckptfs::fuse
