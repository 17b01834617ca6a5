// Mounts a hand-made tree through /dev/fuse in this process and checks it with plain system calls.
// Skipped where /dev/fuse cannot be opened (no FUSE in the container, not root).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "ckptfs/fuse.hpp"
#include "io/runtime.hpp"
#include "vfs/test_files.hpp"

namespace ckptfs::fuse {
namespace {

using testing::memory_file;

std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7919) >> 3);
  return s;
}

class FuseServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const int fd = ::open("/dev/fuse", O_RDWR);
    if (fd < 0) return;
    ::close(fd);
    sources_ = new testing::TempDir;
    mountpoint_ = new testing::TempDir;
    source_path_ = sources_->write("shard.pt", "shard bytes");
    vfs::TreeBuilder b;
    b.add_file("model.safetensors", memory_file(pattern(3 << 20)));
    b.add_file("fp32/pytorch_model.bin", memory_file(pattern(5000)));
    b.add_file("broken.bin", memory_file(pattern(100), {}, true));
    b.add_file("from_shard.bin", memory_file("x", {io::File::open_standalone(source_path_)}));
    tree_ = std::make_shared<const vfs::VirtualTree>(std::move(b).build());
    server_ = new std::thread([] {
      ServeOptions options;
      options.mountpoint = mountpoint_->path().string();
      options.foreground = true;
      options.max_threads = 4;
      options.read_ahead_kb = 0;
      try {
        io::Runtime runtime;
        serve(tree_, options, runtime);
      } catch (const std::exception& e) {
        failure_ = e.what();
      }
      server_done_ = true;
    });
    // Mounted once the mount point's device differs from its parent's.
    struct stat parent {};
    ::stat(mountpoint_->path().parent_path().c_str(), &parent);
    for (int i = 0; i < 200 && !mounted_ && !server_done_; ++i) {
      struct stat st {};
      mounted_ = ::stat(mountpoint_->path().c_str(), &st) == 0 && st.st_dev != parent.st_dev;
      if (!mounted_) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  static void TearDownTestSuite() {
    if (server_ == nullptr) return;
    const std::string mnt = mountpoint_->path().string();
    if (std::system(("fusermount3 -u '" + mnt + "'").c_str()) != 0)
      std::system(("fusermount3 -u -z '" + mnt + "'").c_str());
    server_->join();
    delete server_;
    tree_.reset();
    delete mountpoint_;
    delete sources_;
  }

  void SetUp() override {
    if (server_ == nullptr) GTEST_SKIP() << "/dev/fuse is not available";
    ASSERT_TRUE(mounted_) << (server_done_ ? failure_ : "timed out");
  }

  static std::string at(const std::string& name) { return (mountpoint_->path() / name).string(); }

  static std::string read_all(const std::string& name) {
    const int fd = ::open(at(name).c_str(), O_RDONLY);
    EXPECT_GE(fd, 0) << name << ": " << std::strerror(errno);
    std::string out;
    char buf[65536];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return out;
  }

  static inline testing::TempDir* sources_ = nullptr;
  static inline testing::TempDir* mountpoint_ = nullptr;
  static inline std::filesystem::path source_path_;
  static inline std::shared_ptr<const vfs::VirtualTree> tree_;
  static inline std::thread* server_ = nullptr;
  static inline bool mounted_ = false;
  static inline std::atomic<bool> server_done_ = false;
  static inline std::string failure_;  // written before server_done_ is set
};

TEST_F(FuseServer, StatShowsExactSizesAndReadOnlyModes) {
  struct stat st {};
  ASSERT_EQ(::stat(at("model.safetensors").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 3 << 20);
  EXPECT_EQ(st.st_blocks, (3 << 20) / 512);
  EXPECT_EQ(st.st_mode, S_IFREG | 0444);
  ASSERT_EQ(::stat(at("fp32/pytorch_model.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_blocks, (5000 + 511) / 512);
  ASSERT_EQ(::stat(at("fp32").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode, S_IFDIR | 0555);
  EXPECT_EQ(st.st_nlink, 2u);
  ASSERT_EQ(::stat(mountpoint_->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 3u);
  for (int i = 0; i < 2; ++i) {  // the second miss is answered from the kernel's negative cache
    EXPECT_NE(::stat(at("missing").c_str(), &st), 0);
    EXPECT_EQ(errno, ENOENT);
  }
}

TEST_F(FuseServer, ReaddirListsEveryName) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(mountpoint_->path()))
    names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"broken.bin", "from_shard.bin", "fp32", "model.safetensors"}));
}

TEST_F(FuseServer, ReadsMatchTheVirtualFile) {
  const std::string expected = pattern(3 << 20);
  EXPECT_EQ(read_all("model.safetensors"), expected);
  const int fd = ::open(at("model.safetensors").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::string buf(1 << 20, '\0');
  for (uint64_t offset : {0ull, 1ull, 4095ull, 1234567ull, (3ull << 20) - 10}) {
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(offset));
    ASSERT_EQ(n, static_cast<ssize_t>(std::min<uint64_t>(buf.size(), expected.size() - offset)));
    EXPECT_EQ(buf.substr(0, n), expected.substr(offset, n)) << offset;
  }
  EXPECT_EQ(::pread(fd, buf.data(), buf.size(), 3 << 20), 0);  // at EOF
  ::close(fd);
}

TEST_F(FuseServer, MmapSharedAndPrivate) {
  const std::string expected = pattern(5000);
  const int fd = ::open(at("fp32/pytorch_model.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  for (int flags : {MAP_SHARED, MAP_PRIVATE}) {
    void* p = ::mmap(nullptr, expected.size(), PROT_READ, flags, fd, 0);
    ASSERT_NE(p, MAP_FAILED) << std::strerror(errno);
    EXPECT_EQ(std::string(static_cast<const char*>(p), expected.size()), expected);
    ::munmap(p, expected.size());
  }
  ::close(fd);
}

TEST_F(FuseServer, WritesFailWithErofs) {
  errno = 0;
  EXPECT_LT(::open(at("model.safetensors").c_str(), O_WRONLY), 0);
  EXPECT_EQ(errno, EROFS);
  EXPECT_LT(::open(at("new").c_str(), O_WRONLY | O_CREAT, 0644), 0);
  EXPECT_EQ(errno, EROFS);
  EXPECT_NE(::mkdir(at("d").c_str(), 0755), 0);
  EXPECT_EQ(errno, EROFS);
  EXPECT_NE(::unlink(at("model.safetensors").c_str()), 0);
  EXPECT_EQ(errno, EROFS);
  EXPECT_NE(::rename(at("model.safetensors").c_str(), at("m").c_str()), 0);
  EXPECT_EQ(errno, EROFS);
  EXPECT_NE(::truncate(at("model.safetensors").c_str(), 0), 0);
  EXPECT_EQ(errno, EROFS);
  struct statvfs sv {};
  ASSERT_EQ(::statvfs(mountpoint_->path().c_str(), &sv), 0);
  EXPECT_NE(sv.f_flag & ST_RDONLY, 0u);
}

TEST_F(FuseServer, XattrsAreAbsent) {
  char buf[64];
  EXPECT_LT(::getxattr(at("model.safetensors").c_str(), "user.x", buf, sizeof buf), 0);
  EXPECT_TRUE(errno == ENOTSUP || errno == ENODATA) << std::strerror(errno);
  EXPECT_EQ(::listxattr(at("model.safetensors").c_str(), buf, sizeof buf), 0);
}

TEST_F(FuseServer, SourceErrorsGiveEioForThatFileOnly) {
  const int fd = ::open(at("broken.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char c;
  EXPECT_LT(::read(fd, &c, 1), 0);
  EXPECT_EQ(errno, EIO);
  ::close(fd);
  EXPECT_EQ(read_all("fp32/pytorch_model.bin"), pattern(5000));
}

// An open trusts the check of an open before it for source_check_ms (io's SourceCheck test shows the
// window): a change is seen by the first open after that interval, and for good.
TEST_F(FuseServer, OpenFailsOnceASourceChanged) {
  EXPECT_EQ(read_all("from_shard.bin"), "x");
  sources_->write("shard.pt", "a longer replacement");
  std::this_thread::sleep_for(std::chrono::milliseconds(ServeOptions{}.source_check_ms + 50));
  for (int i = 0; i < 2; ++i) {
    errno = 0;
    const int fd = ::open(at("from_shard.bin").c_str(), O_RDONLY);
    EXPECT_LT(fd, 0);
    EXPECT_EQ(errno, EIO);
    if (fd >= 0) ::close(fd);  // an open file would keep the unmount waiting
  }
  EXPECT_EQ(read_all("fp32/pytorch_model.bin"), pattern(5000));
}

TEST_F(FuseServer, ParallelReadersSeeTheSameBytes) {
  const std::string expected = pattern(3 << 20);
  std::vector<std::thread> readers;
  std::atomic<int> mismatches = 0;
  for (int t = 0; t < 8; ++t) {
    readers.emplace_back([&, t] {
      const int fd = ::open(at("model.safetensors").c_str(), O_RDONLY);
      std::string buf(65536 + t, '\0');
      for (uint64_t off = t * 4096; off < expected.size(); off += 300000) {
        const ssize_t n = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(off));
        if (n <= 0 || buf.compare(0, n, expected, off, n) != 0) ++mismatches;
      }
      ::close(fd);
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(mismatches, 0);
}

TEST_F(FuseServer, MountPointChecks) {
  // This mount is plain "fuse" (no subtype=ckptfs), so another mount may go on top of it.
  const std::string mnt = mountpoint_->path().string();
  const auto entry = find_mount(std::filesystem::canonical(mnt).string());
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->type, "fuse");
  EXPECT_EQ(check_mountpoint(mnt), std::filesystem::canonical(mnt).string());
  EXPECT_FALSE(find_mount((sources_->path() / "shard.pt").string()).has_value());
  for (const std::string& bad :
       {(sources_->path() / "shard.pt").string(), (sources_->path() / "nope").string()}) {
    try {
      check_mountpoint(bad);
      ADD_FAILURE() << bad << " passed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::mount_failed);
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace ckptfs::fuse
