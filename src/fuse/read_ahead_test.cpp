// The prefetch window of an open file: which reads move it on, which leave it alone.
#include "fuse/read_ahead.hpp"

#include <gtest/gtest.h>

namespace ckptfs::fuse {
namespace {

constexpr uint64_t MiB = 1 << 20;
constexpr uint64_t kWindow = 32 * MiB, kSize = 1024 * MiB;
using Range = std::optional<std::pair<uint64_t, uint64_t>>;

Range read(ReadAhead& ra, uint64_t offset, uint64_t length = MiB / 2) {
  return ra.next(offset, length, kWindow, kWindow / 4, kSize);
}

TEST(ReadAhead, SequentialReaderKeepsTheWindowFullAhead) {
  ReadAhead ra;
  EXPECT_EQ(read(ra, 0), Range({MiB / 2, kWindow}));  // from the start: at once
  // then in steps of a quarter of the window, once that much was read
  for (uint64_t offset = MiB / 2; offset < 8 * MiB; offset += MiB / 2)
    EXPECT_EQ(read(ra, offset), std::nullopt) << offset;
  EXPECT_EQ(read(ra, 8 * MiB), Range({kWindow + MiB / 2, 8 * MiB}));
  EXPECT_EQ(read(ra, 8 * MiB + MiB / 2), std::nullopt);
  // A request of the same reader that arrives late (the kernel sends several at once) adds nothing.
  EXPECT_EQ(read(ra, 8 * MiB - MiB / 4, MiB / 4), std::nullopt);
}

TEST(ReadAhead, RandomReadsPrefetchNothing) {
  ReadAhead ra;
  for (uint64_t offset : {700 * MiB, 100 * MiB, 400 * MiB, 900 * MiB, 250 * MiB, 50 * MiB, 600 * MiB,
                          800 * MiB, 300 * MiB, 500 * MiB, 150 * MiB})
    EXPECT_EQ(read(ra, offset, 4096), std::nullopt) << offset;
}

TEST(ReadAhead, AReaderThatJumpsBackStartsANewStream) {
  // safetensors' load_file: a page of every tensor first, scattered, then the tensors front to back.
  ReadAhead ra;
  for (uint64_t tensor = 0; tensor < 16; ++tensor) read(ra, 50 * MiB * tensor + 8 * MiB, 4096);
  EXPECT_EQ(read(ra, 4 * MiB), std::nullopt);  // far from every stream: a new one
  EXPECT_EQ(read(ra, 4 * MiB + MiB / 2), Range({5 * MiB, kWindow}));
  EXPECT_EQ(read(ra, 5 * MiB), std::nullopt);  // the window is full but for half a MiB
  EXPECT_EQ(read(ra, 12 * MiB + MiB / 2), Range({kWindow + 5 * MiB, 8 * MiB}));
}

TEST(ReadAhead, InterleavedReadersEachKeepTheirWindow) {
  // Two threads copying tensors out of one mapping, far apart.
  ReadAhead ra;
  const uint64_t a = 100 * MiB, b = 600 * MiB;
  read(ra, a);
  read(ra, b);
  EXPECT_EQ(read(ra, a + MiB / 2), Range({a + MiB, kWindow}));
  EXPECT_EQ(read(ra, b + MiB / 2), Range({b + MiB, kWindow}));
  EXPECT_EQ(read(ra, a + 8 * MiB + MiB / 2), Range({a + MiB + kWindow, 8 * MiB}));
  EXPECT_EQ(read(ra, b + 8 * MiB + MiB / 2), Range({b + MiB + kWindow, 8 * MiB}));
}

TEST(ReadAhead, TheWindowStopsAtTheEndOfTheFile) {
  ReadAhead ra;
  read(ra, kSize - 8 * MiB);
  EXPECT_EQ(read(ra, kSize - 8 * MiB + MiB / 2), Range({kSize - 7 * MiB, 7 * MiB}));
  EXPECT_EQ(read(ra, kSize - 7 * MiB), std::nullopt);
}

TEST(OpenFiles, HandlesOfOneFileShareItsWindow) {
  OpenFiles files;
  const views::VirtualFilePtr bytes = views::make_bytes_file("file");
  const auto no_window = [] { return PrefetchWindow{}; };
  ReadAhead* first = &files.open(7, bytes, no_window)->read_ahead;
  ReadAhead* second = &files.open(7, bytes, no_window)->read_ahead;
  EXPECT_EQ(first, second);
  EXPECT_NE(&files.open(8, bytes, no_window)->read_ahead, first);
  // Two threads, each with a handle, copying neighbouring tensors: one window, advised once.
  const uint64_t tensor = 4 * MiB;
  read(*first, 100 * MiB);
  EXPECT_EQ(read(*first, 100 * MiB + MiB / 2), Range({101 * MiB, kWindow}));
  EXPECT_EQ(read(*second, 100 * MiB + tensor), std::nullopt);  // the first's window covers it
  files.release(7);
  EXPECT_EQ(read(*second, 100 * MiB + 2 * tensor + MiB / 2), Range({100 * MiB + kWindow + MiB, 2 * tensor}));
  files.release(7);
  files.release(8);
}

TEST(OpenFiles, FilesStreamingFromObjectsDivideTheShare) {
  OpenFiles files;
  const views::VirtualFilePtr bytes = views::make_bytes_file("file");
  const auto shared = [] { return PrefetchWindow{96 * MiB, 48 * MiB, true}; };
  OpenFile* fp32 = files.open(7, bytes, shared);
  OpenFile* bf16 = files.open(8, bytes, shared);
  OpenFile* local = files.open(9, bytes, [] { return PrefetchWindow{kWindow, kWindow / 4}; });
  EXPECT_EQ(files.window_of(*fp32).window, 96 * MiB);  // alone, it would have the whole share
  files.set_streaming(*fp32, true);
  EXPECT_EQ(files.window_of(*fp32).window, 96 * MiB);
  EXPECT_EQ(files.window_of(*bf16).window, 48 * MiB);  // it would be the second
  files.set_streaming(*bf16, true);
  EXPECT_EQ(files.window_of(*fp32).window, 48 * MiB);
  EXPECT_EQ(files.window_of(*fp32).step, 24 * MiB);
  EXPECT_EQ(files.window_of(*local).window, kWindow);  // a local file's window is its own
  files.set_streaming(*bf16, true);                    // said twice, counted once
  files.set_streaming(*fp32, false);                   // prefetched to its end
  EXPECT_EQ(files.window_of(*bf16).window, 96 * MiB);
  files.set_streaming(*fp32, true);
  files.release(7);  // closed while streaming
  EXPECT_EQ(files.window_of(*bf16).window, 96 * MiB);
  files.release(8);
  files.release(9);
}

}  // namespace
}  // namespace ckptfs::fuse
