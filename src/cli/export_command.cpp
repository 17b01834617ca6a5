// `ckptfs export SRC OUT [--tag T] [--universal] [--shard-size SIZE]`: streams the views of a tag into OUT
// with bounded memory; the universal/ tree (optimizer state included, about three times the fp32 bytes) on
// request; safetensors views larger than SIZE as save_pretrained shards them (without the mount's
// unsharded/ copy).
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/layout.hpp"
#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/source_argument.hpp"
#include "cli/progress.hpp"

namespace ckptfs::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage = "ckptfs export SRC OUT [--tag T] [--strict] [--universal] [--shard-size SIZE]\n"
                         "       (SRC s3://BUCKET/PREFIX: [--endpoint URL] [--region R] [--s3-path-style] [--s3-no-sign])";
constexpr size_t kChunk = 8u << 20;  // bytes per read: memory use is twice this, not the model size

struct OutputError : Error {
  explicit OutputError(const std::string& message) : Error(ExitCode::output_failed, message) {}
};

void write_all(int fd, std::span<const std::byte> bytes, const fs::path& path) {
  for (size_t done = 0; done < bytes.size();) {
    ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw OutputError(fmt::format("{}: write failed: {}", path.string(), std::strerror(errno)));
    done += static_cast<size_t>(w);
  }
}

// Writes `file` to `path` through a temporary name, so OUT never holds a partial file under a final name.
// Two buffers: the next chunk is read from the shards while the previous one is written.
void write_view(const views::VirtualFile& file, const fs::path& path, Progress& progress) {
  const fs::path partial = path.string() + ".partial";
  int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw OutputError(fmt::format("{}: cannot create: {}", partial.string(), std::strerror(errno)));
  const size_t chunk = static_cast<size_t>(std::min<uint64_t>(kChunk, std::max<uint64_t>(file.size(), 1)));
  std::array<std::vector<std::byte>, 2> buffers{std::vector<std::byte>(chunk), std::vector<std::byte>(chunk)};
  auto read_chunk = [&](uint64_t offset, std::vector<std::byte>& buffer) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, file.size() - offset));
    file.read(offset, std::span(buffer.data(), n));
    return std::span<const std::byte>(buffer.data(), n);
  };
  std::future<std::span<const std::byte>> pending;
  try {
    if (file.size() > 0) pending = std::async(std::launch::async, read_chunk, 0, std::ref(buffers[0]));
    for (uint64_t offset = 0, index = 0; offset < file.size(); ++index) {
      auto bytes = pending.get();
      const uint64_t next = offset + bytes.size();
      if (next < file.size())
        pending = std::async(std::launch::async, read_chunk, next, std::ref(buffers[(index + 1) % 2]));
      write_all(fd, bytes, partial);
      progress.advance(bytes.size());
      offset = next;
    }
    if (::close(fd) != 0) {
      fd = -1;
      throw OutputError(fmt::format("{}: close failed: {}", partial.string(), std::strerror(errno)));
    }
    fd = -1;
    std::error_code ec;
    fs::rename(partial, path, ec);
    if (ec)
      throw OutputError(fmt::format("{}: cannot rename to {}: {}", partial.string(), path.filename().string(),
                                    ec.message()));
  } catch (...) {
    if (pending.valid()) pending.wait();
    if (fd >= 0) ::close(fd);
    std::error_code ec;
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

}  // namespace

int run_export(std::span<const std::string> args) {
  try {
    Arguments a = parse_arguments(args, {"--universal", "--strict"}, 2, kUsage);
    ShardOptions shards{.unsharded_copy = false};
    if (a.shard_size) shards.max_shard_size = parse_shard_size_option("--shard-size", *a.shard_size);
    const fs::path source = open_source(a.positional[0], a.s3), out = a.positional[1];
    if (!io::is_remote(source) && is_inside(out, source))
      throw UsageError(
          fmt::format("{}: is inside the source directory; ckptfs never writes to the source", out.string()));
    Checkpoint cp = open_checkpoint(source, a.open_options());
    const Tag& tag = cp.latest_tag();
    const auto views = tag_views(tag, a.has("--universal"), shards);
    uint64_t total = 0;
    for (const auto& v : views) total += v.file->size();
    Progress progress(total);
    for (const auto& v : views) {
      const fs::path path = out / v.path;
      std::error_code ec;
      fs::create_directories(path.parent_path(), ec);
      if (ec)
        throw OutputError(
            fmt::format("{}: cannot create directory: {}", path.parent_path().string(), ec.message()));
      progress.set_label(v.path);
      write_view(*v.file, path, progress);
    }
    progress.finish();
    return 0;
  } catch (const std::exception& e) {
    return report_error(e);
  }
}

}  // namespace ckptfs::cli
