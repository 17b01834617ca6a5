#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ckptfs/error.hpp"
#include "ckptfs/io.hpp"

namespace ckptfs::io {

namespace {

int64_t mtime_of(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

File::File(std::filesystem::path path, int fd, uint64_t size, int64_t mtime_ns)
    : path_(std::move(path)), fd_(fd), size_(size), mtime_ns_(mtime_ns) {}

File::~File() {
  ::close(fd_);
}

std::shared_ptr<File> File::open(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SourceError(fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw SourceError(fmt::format("{}: cannot stat: {}", path.string(), std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw SourceError(fmt::format("{}: not a regular file", path.string()));
  }
  return std::shared_ptr<File>(new File(path, fd, static_cast<uint64_t>(st.st_size), mtime_of(st)));
}

void File::read_exact(uint64_t offset, std::span<std::byte> dst) const {
  if (offset > size_ || dst.size() > size_ - offset) {
    throw SourceError(fmt::format("{}: read of {} bytes at offset {} runs past the end ({} bytes)",
                                  path_.string(), dst.size(), offset, size_));
  }
  size_t done = 0;
  while (done < dst.size()) {
    ssize_t n = ::pread(fd_, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SourceError(fmt::format("{}: read error at offset {}: {}", path_.string(), offset + done,
                                    std::strerror(errno)));
    }
    if (n == 0) {
      throw SourceError(fmt::format("{}: file shrank: no data at offset {} (was {} bytes)", path_.string(),
                                    offset + done, size_));
    }
    done += static_cast<size_t>(n);
  }
}

std::vector<std::byte> File::read(uint64_t offset, uint64_t length) const {
  if (offset > size_ || length > size_ - offset) {
    throw SourceError(fmt::format("{}: read of {} bytes at offset {} runs past the end ({} bytes)",
                                  path_.string(), length, offset, size_));
  }
  std::vector<std::byte> out(length);
  read_exact(offset, out);
  return out;
}

bool File::unchanged() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return false;
  return static_cast<uint64_t>(st.st_size) == size_ && mtime_of(st) == mtime_ns_;
}

FilePtr FileSet::open(const std::filesystem::path& path) {
  std::error_code ec;
  auto key = std::filesystem::weakly_canonical(path, ec);
  if (ec) key = path;
  std::lock_guard lock(mutex_);
  auto it = files_.find(key);
  if (it != files_.end()) return it->second;
  auto file = File::open(path);
  files_.emplace(key, file);
  return file;
}

}  // namespace ckptfs::io
