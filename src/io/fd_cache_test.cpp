// The bounded descriptor cache behind io::File: many files read through few descriptors, evicted ones
// reopened and checked to be the file that was indexed.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ckptfs/error.hpp"
#include "ckptfs/io.hpp"
#include "io/runtime.hpp"
#include "vfs/test_files.hpp"

namespace ckptfs::io {
namespace {

using testing::TempDir;

size_t process_fds() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (::readdir(d) != nullptr) ++n;
  ::closedir(d);
  return n;
}

std::string read_all(const File& f) {
  auto bytes = f.read(0, f.size());
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// Files "0", "1", ... of `dir`, file i holding content(i), each opened from `source`.
template <class Content>
std::vector<FilePtr> open_numbered(const Source& source, const TempDir& dir, int count, Content content) {
  std::vector<FilePtr> files;
  for (int i = 0; i < count; ++i) files.push_back(source.open(dir.write(std::to_string(i), content(i))));
  return files;
}

// A Runtime keeping at most `max_open` descriptors open for the files of `dir`.
RuntimeOptions keeping_open(size_t max_open) {
  RuntimeOptions options;
  options.max_open_files = max_open;
  return options;
}

struct CachedDir {
  CachedDir(const TempDir& dir, size_t max_open)
      : runtime(keeping_open(max_open)), source(runtime.open_local(dir.path())) {}
  size_t open_count() { return runtime.caches().descriptors.open_count(); }
  FilePtr open(const std::filesystem::path& path) const { return source->open(path); }
  Runtime runtime;
  SourcePtr source;
};

TEST(FdCacheTest, ManyFilesReadThroughABoundedNumberOfDescriptors) {
  TempDir dir;
  CachedDir source(dir, 8);
  const size_t before = process_fds();
  std::vector<FilePtr> files =
      open_numbered(*source.source, dir, 200, [](int i) { return "content of file " + std::to_string(i); });
  EXPECT_LE(source.open_count(), 8u);
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < 200; ++i) ASSERT_EQ(read_all(*files[i]), "content of file " + std::to_string(i));
  EXPECT_LE(source.open_count(), 8u);
  EXPECT_LE(process_fds(), before + 8);
  files.clear();
  EXPECT_EQ(source.open_count(), 0u);
}

TEST(FdCacheTest, ReopenedFileReplacedWithSameSizeAndMtimeIsRefused) {
  TempDir dir;
  CachedDir source(dir, 1);
  const auto path = dir.write("shard.pt", "original bytes");
  FilePtr shard = source.open(path);
  FilePtr other = source.open(dir.write("other.pt", "evicts the shard"));  // shard's fd is closed now
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  // A same-size replacement that keeps the mtime: only the inode (and ctime) tell.
  const auto replacement = dir.write("new.pt", "replaced bytes");
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, replacement.c_str(), times, 0), 0);
  std::filesystem::rename(replacement, path);
  EXPECT_FALSE(shard->unchanged());
  try {
    read_all(*shard);
    FAIL() << "read of a replaced file succeeded";
  } catch (const SourceError& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("changed since it was indexed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_all(*other), "evicts the shard");
}

TEST(FdCacheTest, UnchangedFileIsReopenedTransparently) {
  TempDir dir;
  CachedDir source(dir, 1);
  FilePtr a = source.open(dir.write("a", "aaaa")), b = source.open(dir.write("b", "bbbb"));
  EXPECT_TRUE(a->unchanged());
  EXPECT_EQ(read_all(*a), "aaaa");
  EXPECT_EQ(read_all(*b), "bbbb");
  EXPECT_EQ(read_all(*a), "aaaa");
  EXPECT_EQ(source.open_count(), 1u);
}

TEST(FdCacheTest, InPlaceChangeOfTheSameSizeIsDetected) {
  TempDir dir;
  const auto path = dir.write("f", "12345678");
  FilePtr f = File::open_standalone(path);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  dir.write("f", "87654321");
  const struct timespec times[2] = {st.st_atim, st.st_mtim};  // mtime put back: ctime still moves
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_FALSE(f->unchanged());
}

// Reads load each File's descriptor without a lock while other reads reopen evicted ones: every read still
// returns its file's bytes, and the cache stays within its bound.
TEST(FdCacheTest, ThreadsReadWhileTheCacheEvicts) {
  TempDir dir;
  CachedDir source(dir, 4);
  const size_t before = process_fds();
  const std::vector<FilePtr> files = open_numbered(
      *source.source, dir, 64, [](int i) { return std::string(4096, static_cast<char>('a' + i % 26)); });
  std::atomic<bool> stop{false};
  std::atomic<size_t> wrong{0}, reads{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 12; ++t) {
    readers.emplace_back([&, t] {
      std::vector<std::byte> buf(512);
      for (unsigned i = static_cast<unsigned>(t); !stop.load(); i = i * 1103515245u + 12345u) {
        const size_t f = (i >> 8) % files.size();
        try {
          files[f]->read_exact((i >> 4) % 3584, buf);
          for (std::byte b : buf)
            if (b != static_cast<std::byte>('a' + f % 26)) ++wrong;
        } catch (const std::exception&) {
          ++wrong;
        }
        ++reads;
      }
    });
  }
  while (reads.load() < 20000) std::this_thread::yield();
  stop = true;
  for (auto& r : readers) r.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_LE(source.open_count(), 4u);
  EXPECT_LE(process_fds(), before + 4);
}

TEST(FileSet, ThreadsOpeningOnePathGetOneFile) {
  TempDir dir;
  const auto path = dir.write("rank_0.pt", "rank zero");
  Runtime runtime;
  const SourcePtr source = runtime.open_local(dir.path());
  FileSet set(*source);
  std::vector<FilePtr> got(8);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) threads.emplace_back([&, t] { got[t] = set.open(path); });
  for (auto& t : threads) t.join();
  for (const auto& f : got) EXPECT_EQ(f, got[0]);
  EXPECT_EQ(set.open(dir.path() / "." / "rank_0.pt"), got[0]);
}

// A check that passed is trusted for the interval; a change is seen by the first check after it, and
// stays seen.
TEST(SourceCheck, AChangeIsSeenOnceTheIntervalHasPassed) {
  using namespace std::chrono_literals;
  TempDir dir;
  const auto path = dir.write("shard.pt", "12345678");
  FilePtr f = File::open_standalone(path);
  EXPECT_TRUE(f->unchanged_within(1h));
  dir.write("shard.pt", "1234");
  EXPECT_TRUE(f->unchanged_within(1h));  // within the interval of the check above: not stat'ed again
  EXPECT_FALSE(f->unchanged_within(0ns));
  EXPECT_FALSE(f->unchanged_within(1h));
}

TEST(OpenFileLimit, SoftLimitIsRaisedToTheHardLimit) {
  const uint64_t raised = raise_open_file_limit();
  struct rlimit limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  EXPECT_EQ(raised, limit.rlim_cur);
  if (limit.rlim_max != RLIM_INFINITY) {
    EXPECT_EQ(limit.rlim_cur, limit.rlim_max);
  }
}

}  // namespace
}  // namespace ckptfs::io
