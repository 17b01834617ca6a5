#include "cli/view_output.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <functional>
#include <future>
#include <span>
#include <vector>

namespace ckptfs::cli {

namespace fs = std::filesystem;

namespace {

constexpr size_t kChunk = 8u << 20;  // bytes per read: memory use is twice this, not the view's size

void write_all(int fd, std::span<const std::byte> bytes, const std::string& output) {
  for (size_t done = 0; done < bytes.size();) {
    ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EPIPE) throw OutputClosed(fmt::format("{}: closed by its reader", output));
    if (w <= 0) throw OutputError(fmt::format("{}: write failed: {}", output, std::strerror(errno)));
    done += static_cast<size_t>(w);
  }
}

}  // namespace

// Two buffers: the next chunk is read from the shards while the previous one is written.
void stream_view(const views::VirtualFile& file, const std::string& view, int fd, const std::string& output,
                 Progress& progress) {
  const uint64_t size = file.size();
  const size_t chunk = static_cast<size_t>(std::min<uint64_t>(kChunk, std::max<uint64_t>(size, 1)));
  std::array<std::vector<std::byte>, 2> buffers{std::vector<std::byte>(chunk), std::vector<std::byte>(chunk)};
  // Objects of a store have no kernel readahead under them: each chunk's source ranges and the next one's
  // are prefetched before the chunk is read, so that the block cache fetches them in parallel, each rank
  // object's in one GET per chunk (a read after the parse's prefetches of an object fetches only what it
  // asks: one GET per tensor slice).
  const bool remote = io::reads_objects(file.sources());
  auto read_chunk = [&](uint64_t offset, std::vector<std::byte>& buffer) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, size - offset));
    if (remote) file.prefetch(offset, std::min<uint64_t>(2 * chunk, size - offset));
    try {
      file.read(offset, std::span(buffer.data(), n));
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("{}: read of bytes {}-{} of {} failed: {}", view, offset, offset + n,
                                        size, e.what()));
    }
    return std::span<const std::byte>(buffer.data(), n);
  };
  std::future<std::span<const std::byte>> pending;
  try {
    if (size > 0) pending = std::async(std::launch::async, read_chunk, 0, std::ref(buffers[0]));
    for (uint64_t offset = 0, index = 0; offset < size; ++index) {
      auto bytes = pending.get();
      const uint64_t next = offset + bytes.size();
      if (next < size)
        pending = std::async(std::launch::async, read_chunk, next, std::ref(buffers[(index + 1) % 2]));
      write_all(fd, bytes, output);
      progress.advance(bytes.size());
      offset = next;
    }
  } catch (...) {
    if (pending.valid()) pending.wait();
    throw;
  }
}

void check_sources_unchanged(const views::VirtualFile& file, const std::string& view) {
  for (const auto& source : file.sources())
    if (!source->unchanged())
      throw SourceError(
          fmt::format("{}: {}: changed while it was read (replaced, or its size, mtime or ctime "
                      "differ): the bytes written may mix two versions",
                      view, source->path().string()));
}

namespace {

// stream_view into `fd` (named `name`), then `after` (if any); `fd` closed either way.
void stream_and_close(const views::VirtualFile& file, const std::string& view, int fd,
                      const std::string& name, Progress& progress, const std::function<void()>& after) {
  try {
    stream_view(file, view, fd, name, progress);
    if (after) after();
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw OutputError(fmt::format("{}: close failed: {}", name, std::strerror(errno)));
}

}  // namespace

void write_view(const views::VirtualFile& file, const std::string& view, const fs::path& path,
                Progress& progress, const std::function<void()>& before_rename) {
  std::error_code ec;
  if (const auto status = fs::status(path, ec);
      !ec && fs::exists(status) && !fs::is_regular_file(status) && !fs::is_directory(status)) {
    // a device or a FIFO (-o /dev/null): written in place; a rename onto it would replace the node itself
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) throw OutputError(fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
    stream_and_close(file, view, fd, path.string(), progress, before_rename);
    return;
  }
  const fs::path partial = path.string() + ".partial";
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw OutputError(fmt::format("{}: cannot create: {}", partial.string(), std::strerror(errno)));
  try {
    stream_and_close(file, view, fd, partial.string(), progress, before_rename);
    fs::rename(partial, path, ec);
    if (ec)
      throw OutputError(fmt::format("{}: cannot rename to {}: {}", partial.string(), path.filename().string(),
                                    ec.message()));
  } catch (...) {
    fs::remove(partial, ec);
    throw;
  }
}

bool is_inside(const fs::path& inner, const fs::path& outer) {
  std::error_code ec;
  const auto a = fs::weakly_canonical(inner, ec).string() + "/";
  const auto b = fs::weakly_canonical(outer, ec).string() + "/";
  return a.rfind(b, 0) == 0;
}

}  // namespace ckptfs::cli
