#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ckptfs/error.hpp"
#include "ckptfs/index.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/version.hpp"
#include "index/build_id.hpp"
#include "index/checkpoint_codec.hpp"
#include "index/index_file.hpp"

namespace ckptfs::index {

namespace fs = std::filesystem;

namespace {

// What an index must have been written for: this ckptfs build, this source, these options (a live mount's
// holds the complete saves only: OpenOptions::known).
IndexKey index_key(const fs::path& source, const OpenOptions& options) {
  return {build_id(),
          fmt::format("{}\n{}\n{}{}{}{}{}", version::version_line(), source.string(),
                      options.tag ? "tag " + *options.tag : "all tags", options.strict ? ", strict" : "",
                      options.known ? ", complete saves" : "",
                      options.strip_prefix ? ", strip prefix '" + *options.strip_prefix + "'" : "",
                      options.model_config ? ", config " + options.model_config->string() : "")};
}

// FNV-1a of the key, not of the build id: a file name stable across runs, which a rebuilt ckptfs
// overwrites (std::hash need not be stable).
fs::path index_file(const fs::path& cache_dir, const IndexKey& key) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : key.key) h = (h ^ ch) * 1099511628211ull;
  return cache_dir / fmt::format("{:016x}.index", h);
}

constexpr std::string_view kNoBuildId =
    "this ckptfs has no build id (linked without -Wl,--build-id): no index cache";

[[noreturn]] void cannot_write(const fs::path& path, int err) {
  throw Error(ExitCode::output_failed,
              fmt::format("{}: cannot write the index: {}", path.string(), std::strerror(err)));
}

fs::path canonical_source(const io::Source& source) {
  std::error_code ec;
  fs::path p = source.canonical(source.root(), ec);
  return ec ? fs::absolute(source.root()).lexically_normal() : p;
}

std::span<const std::byte> as_bytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

std::optional<std::string> read_whole(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return std::move(s).str();
}

// Writes `bytes` to `path` through a temporary file and a rename: a reader sees the old index or the
// new one, never half of one. Throws Error(output_failed) naming the path.
void write_atomically(const fs::path& path, const std::string& bytes) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + fmt::format(".{}.tmp", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) cannot_write(tmp, errno);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      fs::remove(tmp, ec);
      cannot_write(tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  fs::rename(tmp, path, ec);
  if (ec) {
    const int err = ec.value();
    fs::remove(tmp, ec);
    cannot_write(path, err);
  }
}

}  // namespace

std::optional<fs::path> default_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/')
    return fs::path(xdg) / "ckptfs";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/')
    return fs::path(home) / ".cache/ckptfs";
  return std::nullopt;
}

Opened open_indexed(io::SourcePtr source, const OpenOptions& options,
                    const std::optional<fs::path>& cache_dir) {
  Opened out;
  out.source = source;
  if (!cache_dir) {
    out.checkpoint = open_checkpoint(*source, options);
    return out;
  }
  const IndexKey key = index_key(canonical_source(*source), options);
  out.index_file = index_file(*cache_dir, key);
  if (key.build_id.empty()) {
    out.parsed_because = kNoBuildId;
  } else if (auto bytes = read_whole(out.index_file)) {
    try {
      out.checkpoint =
          decode_checkpoint(as_bytes(unpack_index(*bytes, key)), source, options.transpose_cache);
      out.from_index = true;
      out.key = key.key;  // a live mount rewrites it as the run saves
      return out;
    } catch (const Error& e) {  // stale or damaged (StaleIndex is a FormatError): parse, and replace it
      out.parsed_because = e.what();
    }
  } else {
    out.parsed_because = "no index yet";
  }
  out.checkpoint = open_checkpoint(*source, options);
  if (!key.build_id.empty()) out.key = key.key;
  return out;
}

std::string save_index(const Opened& opened) {
  if (opened.from_index || opened.key.empty()) return {};
  try {
    write_atomically(opened.index_file, pack_index({build_id(), opened.key},
                                                   encode_checkpoint(*opened.source, opened.checkpoint)));
    return {};
  } catch (const std::exception& e) {  // best effort: the mount works without it, the next one parses
    return fmt::format("index not written (the next mount parses again): {}", e.what());
  }
}

fs::path write_index(const io::Source& source, const OpenOptions& options, const fs::path& cache_dir) {
  const IndexKey key = index_key(canonical_source(source), options);
  if (key.build_id.empty()) throw Error(ExitCode::output_failed, std::string(kNoBuildId));
  const fs::path file = index_file(cache_dir, key);
  write_atomically(file, pack_index(key, encode_checkpoint(source, open_checkpoint(source, options))));
  return file;
}

}  // namespace ckptfs::index
