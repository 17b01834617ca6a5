// The bounded descriptor cache behind io::File: many files read through few descriptors, evicted ones
// reopened and checked to be the file that was indexed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include <string>
#include <vector>

#include "ckptfs/error.hpp"
#include "ckptfs/io.hpp"
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

class FdCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = max_open_files(); }
  void TearDown() override { set_max_open_files(saved_); }
  size_t saved_ = 0;
};

TEST_F(FdCacheTest, ManyFilesReadThroughABoundedNumberOfDescriptors) {
  TempDir dir;
  set_max_open_files(8);
  const size_t before = process_fds();
  std::vector<FilePtr> files;
  for (int i = 0; i < 200; ++i)
    files.push_back(File::open(dir.write(std::to_string(i), "content of file " + std::to_string(i))));
  EXPECT_LE(open_file_count(), 8u);
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < 200; ++i) ASSERT_EQ(read_all(*files[i]), "content of file " + std::to_string(i));
  EXPECT_LE(open_file_count(), 8u);
  EXPECT_LE(process_fds(), before + 8);
  files.clear();
  EXPECT_EQ(open_file_count(), 0u);
}

TEST_F(FdCacheTest, ReopenedFileReplacedWithSameSizeAndMtimeIsRefused) {
  TempDir dir;
  set_max_open_files(1);
  const auto path = dir.write("shard.pt", "original bytes");
  FilePtr shard = File::open(path);
  FilePtr other = File::open(dir.write("other.pt", "evicts the shard"));  // shard's fd is closed now
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

TEST_F(FdCacheTest, UnchangedFileIsReopenedTransparently) {
  TempDir dir;
  set_max_open_files(1);
  FilePtr a = File::open(dir.write("a", "aaaa")), b = File::open(dir.write("b", "bbbb"));
  EXPECT_TRUE(a->unchanged());
  EXPECT_EQ(read_all(*a), "aaaa");
  EXPECT_EQ(read_all(*b), "bbbb");
  EXPECT_EQ(read_all(*a), "aaaa");
  EXPECT_EQ(open_file_count(), 1u);
}

TEST_F(FdCacheTest, InPlaceChangeOfTheSameSizeIsDetected) {
  TempDir dir;
  const auto path = dir.write("f", "12345678");
  FilePtr f = File::open(path);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  dir.write("f", "87654321");
  const struct timespec times[2] = {st.st_atim, st.st_mtim};  // mtime put back: ctime still moves
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_FALSE(f->unchanged());
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
