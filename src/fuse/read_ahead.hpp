// The prefetch policy: how far ahead of a sequential reader of a file the source ranges it will need are
// prefetched (its window), and per open file which of its readers read sequentially and how far ahead of
// each the window has been advised.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include "ckptfs/vfs.hpp"
#include "ckptfs/views.hpp"

namespace ckptfs::fuse {

// A read that continues one of the recent streams of reads (a sequential reader, the kernel's readahead,
// one of several threads copying tensors out of one mmap) moves that stream's window on; any other read
// starts a stream in place of the least recently used one and prefetches nothing, so a random reader
// never makes the kernel read what nobody asked for. One stream per reader would not do: a loader may fault
// in a page of every tensor first (scattered) and then copy the tensors front to back, and several threads
// may fault one mapping at once.
class ReadAhead {
 public:
  // The range to prefetch before serving [offset, offset + length) of a file of `size` bytes, at most
  // `window` bytes past the read, if any: none until `step` bytes of the window are free (but at the
  // end of the file), so that each prefetch hands every source a range worth a request.
  std::optional<std::pair<uint64_t, uint64_t>> next(uint64_t offset, uint64_t length, uint64_t window,
                                                    uint64_t step, uint64_t size);

 private:
  struct Stream {
    uint64_t read_to = 0;        // the end of its furthest read
    uint64_t prefetched_to = 0;  // how far its window has been advised
    uint64_t last_used = 0;
  };
  static constexpr size_t kStreams = 8;
  std::mutex mutex_;
  std::array<Stream, kStreams>
      streams_{};  // one begins at offset 0: a reader from the start prefetches at once
  uint64_t clock_ = 0;
};

// How far ahead of a sequential reader of a file prefetch reaches, and the least it refills that by.
struct PrefetchWindow {
  uint64_t window = 0;
  uint64_t step = 0;
  // A file over objects: the window is what the block cache's memory allows, divided among the files
  // streaming from the store at once (OpenFiles::window_of), each refilling by halves.
  bool shared = false;

  PrefetchWindow divided_among(size_t streams) const {
    const uint64_t part = window / std::max<size_t>(streams, 1);
    return {part, part / 2, shared};
  }
};

// The window of a file of the tree, chosen at its first open: `prefetch_bytes` (-o prefetch) for local
// sources; over objects, what `remote_cache_bytes` (the block cache's memory) allows (read_ahead.cpp says
// how).
PrefetchWindow prefetch_window(const vfs::Node& node, uint64_t prefetch_bytes, uint64_t remote_cache_bytes);

// An open file: what its reads go to (the file's open_layout(), else the file) and its prefetch state.
struct OpenFile {
  OpenFile(views::VirtualFilePtr content, PrefetchWindow prefetch)
      : content(std::move(content)), prefetch(prefetch) {}
  const views::VirtualFilePtr content;
  const PrefetchWindow prefetch;  // chosen at its first open (prefetch_window)
  ReadAhead read_ahead;
  bool streaming = false;  // it holds a part of a shared window (OpenFiles::set_streaming)
};

// One OpenFile per open file, shared by all its handles: the threads of a loader each open the file and
// read neighbouring tensors, one front moving through it that a window per handle would advise several
// times over. Dropped when the last handle closes.
class OpenFiles {
 public:
  // The open state of inode `ino`, made from `file` and `window_of()` by its first open (the layout and the
  // window made outside the lock).
  OpenFile* open(uint64_t ino, const views::VirtualFilePtr& file,
                 const std::function<PrefetchWindow()>& window_of);
  void release(uint64_t ino);

  // The window `file` prefetches with now: a shared one divided among the files streaming, `file` counted.
  PrefetchWindow window_of(const OpenFile& file);
  // Whether `file` streams: from its first prefetch of a shared window until one reaches its end or its
  // last handle closes (a loader that keeps every shard of a model open reads one at a time).
  void set_streaming(OpenFile& file, bool on);
  // Starts the prefetch a read of [start, start + length) of `file` moves its window on by, if any.
  void prefetch_for_read(OpenFile& file, uint64_t start, uint64_t length, uint64_t file_size);

 private:
  struct Entry {
    std::unique_ptr<OpenFile> file;
    size_t handles = 0;
  };
  std::mutex mutex_;
  std::unordered_map<uint64_t, Entry> files_;
  size_t streaming_ = 0;
};

}  // namespace ckptfs::fuse
