#include <fcntl.h>
#include <fmt/format.h>
#include <lz4.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ckptfs/error.hpp"
#include "ckptfs/index.hpp"
#include "index/byte_stream.hpp"
#include "index/checkpoint_codec.hpp"

namespace ckptfs::index {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kMagic = "CKPTFSIX";
// Bump whenever what indexing produces, or its encoding, changes: an index of another version is parsed
// again, never trusted.
// 3: left-out tags, topology ep and experts (DeepSpeed MoE), decoded items; 4: tensor handles, no
// keep-alive catalog lists, view roles apart from states, zero_stage and the universal plan in a DeepSpeed
// part of the tag
constexpr uint64_t kFormatVersion = 4;

// What an index must have been written for: this ckptfs, this source, these options.
std::string index_key(const fs::path& source, const OpenOptions& options) {
  return fmt::format("ckptfs {} index {}\n{}\n{}{}", CKPTFS_VERSION, kFormatVersion, source.string(),
                     options.tag ? "tag " + *options.tag : "all tags", options.strict ? ", strict" : "");
}

// FNV-1a: stable across runs and builds (std::hash need not be).
uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : bytes) h = (h ^ ch) * 1099511628211ull;
  return h;
}

fs::path index_file(const fs::path& cache_dir, const std::string& key) {
  return cache_dir / fmt::format("{:016x}.index", fnv1a(key));
}

fs::path canonical_source(const fs::path& source) {
  std::error_code ec;
  fs::path p = fs::canonical(source, ec);
  return ec ? fs::absolute(source).lexically_normal() : p;
}

std::string compress(const std::string& key, const std::string& raw) {
  if (raw.size() > static_cast<size_t>(LZ4_MAX_INPUT_SIZE))
    throw UnsupportedError("index: too large for one lz4 block");
  ByteWriter out;
  out.data() += kMagic;
  out.u64(kFormatVersion);
  out.text(key);
  out.u64(raw.size());
  // A damaged byte can still decompress and decode into something plausible (another tensor name, a
  // different offset): the checksum of the encoded checkpoint catches it.
  out.u64(fnv1a(raw));
  std::string block(static_cast<size_t>(LZ4_compressBound(static_cast<int>(raw.size()))), '\0');
  const int n = LZ4_compress_default(raw.data(), block.data(), static_cast<int>(raw.size()), static_cast<int>(block.size()));
  if (n <= 0) throw UnsupportedError("index: lz4 compression failed");
  block.resize(static_cast<size_t>(n));
  out.data() += block;
  return std::move(out.data());
}

// The encoded checkpoint in `file`, or why it cannot be used.
std::string decompress(const std::string& file, const std::string& key) {
  if (!file.starts_with(kMagic)) throw FormatError("index: not a ckptfs index");
  ByteReader in(std::string_view(file).substr(kMagic.size()));
  if (in.u64() != kFormatVersion) throw StaleIndex("written by another index format");
  if (in.text() != key) throw StaleIndex("written by another ckptfs version or for other options");
  const uint64_t size = in.u64();
  const uint64_t checksum = in.u64();
  const size_t header = file.size() - in.remaining();
  const size_t compressed = file.size() - header;
  if (size > static_cast<uint64_t>(LZ4_MAX_INPUT_SIZE) || size > compressed * 255 + 16)
    throw FormatError("index: implausible size");
  std::string raw(size, '\0');
  const int n = LZ4_decompress_safe(file.data() + header, raw.data(), static_cast<int>(compressed), static_cast<int>(size));
  if (n < 0 || static_cast<uint64_t>(n) != size) throw FormatError("index: the lz4 block is damaged");
  if (fnv1a(raw) != checksum) throw FormatError("index: damaged (checksum mismatch)");
  return raw;
}

std::optional<std::string> read_whole(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return std::move(s).str();
}

// Writes `bytes` to `path` through a temporary file and a rename: a reader sees the old index or the
// new one, never half of one. Throws SourceError naming the path.
void write_atomically(const fs::path& path, const std::string& bytes) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + fmt::format(".{}.tmp", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw SourceError(fmt::format("{}: cannot write the index: {}", tmp.string(), std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      fs::remove(tmp, ec);
      throw SourceError(fmt::format("{}: cannot write the index: {}", tmp.string(), std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw SourceError(fmt::format("{}: cannot write the index", path.string()));
  }
}

}  // namespace

std::optional<fs::path> default_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/') return fs::path(xdg) / "ckptfs";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') return fs::path(home) / ".cache/ckptfs";
  return std::nullopt;
}

Opened open_indexed(const fs::path& source, const OpenOptions& options, const std::optional<fs::path>& cache_dir) {
  Opened out;
  if (!cache_dir) {
    out.checkpoint = open_checkpoint(source, options);
    return out;
  }
  const std::string key = index_key(canonical_source(source), options);
  out.index_file = index_file(*cache_dir, key);
  if (auto bytes = read_whole(out.index_file)) {
    try {
      out.checkpoint = decode_checkpoint(decompress(*bytes, key));
      out.from_index = true;
      return out;
    } catch (const StaleIndex& e) {
      out.parsed_because = e.what();
    } catch (const Error& e) {  // damaged: parse, and replace it
      out.parsed_because = e.what();
    }
  } else {
    out.parsed_because = "no index yet";
  }
  out.checkpoint = open_checkpoint(source, options);
  out.key = key;
  return out;
}

void save_index(const Opened& opened) {
  if (opened.key.empty()) return;
  try {
    write_atomically(opened.index_file, compress(opened.key, encode_checkpoint(opened.checkpoint)));
  } catch (const std::exception&) {
    // best effort: the mount works without it (and this runs on a thread that must not throw)
  }
}

fs::path write_index(const fs::path& source, const OpenOptions& options, const fs::path& cache_dir) {
  const std::string key = index_key(canonical_source(source), options);
  const fs::path file = index_file(cache_dir, key);
  write_atomically(file, compress(key, encode_checkpoint(open_checkpoint(source, options))));
  return file;
}

}  // namespace ckptfs::index
