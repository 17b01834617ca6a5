#include "s3/disk_cache.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "ckptfs/error.hpp"

namespace ckptfs::s3 {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'c', 'k', 'p', 't', 'f', 's', 'B', '1'};
constexpr const char* kSuffix = ".blk";
// A temporary file this old belongs to no live writer (a crash left it).
constexpr auto kStaleTemp = std::chrono::minutes(10);

struct Header {
  char magic[8];
  std::uint64_t begin;
  std::uint64_t end;
  std::uint64_t checksum;
  std::uint64_t identity_bytes;
};

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// FNV-1a over 8-byte words (then the tail): catches torn or flipped bytes, fast enough for 8 MiB blocks.
std::uint64_t checksum(std::span<const std::byte> bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  for (; i < bytes.size(); ++i) h = (h ^ static_cast<std::uint64_t>(bytes[i])) * 0x100000001b3ull;
  return h;
}

bool read_exactly(int fd, void* dst, std::size_t n, off_t at) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, at);
    if (got <= 0) return false;
    p += got, n -= got, at += got;
  }
  return true;
}

bool write_all(int fd, const void* src, std::size_t n) {
  const auto* p = static_cast<const char*>(src);
  while (n > 0) {
    ssize_t put = ::write(fd, p, n);
    if (put <= 0) return false;
    p += put, n -= put;
  }
  return true;
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// "HASH-BEGIN-END.blk" (hex) back into its parts.
bool parse_name(const std::string& name, std::uint64_t& hash, std::uint64_t& begin, std::uint64_t& end) {
  unsigned long long h, b, e;
  int used = 0;
  if (std::sscanf(name.c_str(), "%16llx-%llx-%llx.blk%n", &h, &b, &e, &used) != 3) return false;
  if (static_cast<std::size_t>(used) != name.size() || e <= b) return false;
  hash = h, begin = b, end = e;
  return true;
}

// Whether the file holds exactly this identity's bytes [begin, end): header, identity, size and checksum.
bool read_verified(const fs::path& path, const std::string& identity, std::uint64_t begin, std::uint64_t end,
                   std::span<std::byte> payload) {
  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) return false;
  Header h;
  if (!read_exactly(file.fd, &h, sizeof h, 0) || std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 ||
      h.begin != begin || h.end != end || h.identity_bytes != identity.size())
    return false;
  std::string stored(identity.size(), '\0');
  if (!read_exactly(file.fd, stored.data(), stored.size(), sizeof h) || stored != identity) return false;
  off_t at = sizeof h + stored.size();
  if (!read_exactly(file.fd, payload.data(), payload.size(), at)) return false;
  char extra;
  if (::pread(file.fd, &extra, 1, at + payload.size()) != 0) return false;  // longer than it says
  return checksum(payload) == h.checksum;
}

}  // namespace

DiskCache::DiskCache(fs::path dir, std::uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || ::access(dir_.c_str(), R_OK | W_OK | X_OK) != 0)
    throw ckptfs::Error(ExitCode::usage, fmt::format("cache_dir {}: not a writable directory{}",
                                                     dir_.string(), ec ? ": " + ec.message() : ""));
  index_existing_files();
}

fs::path DiskCache::file_of(std::uint64_t hash, std::uint64_t begin, std::uint64_t end) const {
  return dir_ / fmt::format("{:016x}-{:x}-{:x}{}", hash, begin, end, kSuffix);
}

void DiskCache::index_existing_files() {
  struct Found {
    std::uint64_t hash, begin, end, bytes;
    fs::file_time_type mtime;
  };
  std::vector<Found> found;
  const auto now = fs::file_time_type::clock::now();
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(dir_, ec)) {
    std::string name = item.path().filename().string();
    auto mtime = item.last_write_time(ec);
    if (ec) continue;
    Found f{0, 0, 0, 0, mtime};
    if (parse_name(name, f.hash, f.begin, f.end) && item.is_regular_file(ec)) {
      f.bytes = item.file_size(ec);
      if (!ec) found.push_back(f);
    } else if (name.find(".tmp-") != std::string::npos && now - mtime > kStaleTemp) {
      fs::remove(item.path(), ec);
    }
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  for (const Found& f : found) {
    Entries& entries = objects_[f.hash];
    if (overlaps(entries, f.begin, f.end)) {  // two mounts shared the directory: keep the first
      fs::remove(file_of(f.hash, f.begin, f.end), ec);
      continue;
    }
    entries.emplace(f.begin, Entry{f.end, f.bytes, ++clock_});
    bytes_ += f.bytes;
  }
  evict_beyond_bound();
}

bool DiskCache::overlaps(const Entries& entries, std::uint64_t begin, std::uint64_t end) const {
  auto next = entries.lower_bound(begin);
  if (next != entries.end() && next->first < end) return true;
  return next != entries.begin() && std::prev(next)->second.end > begin;
}

std::vector<DiskCache::Segment> DiskCache::cover(const std::string& identity, std::uint64_t begin,
                                                 std::uint64_t end) const {
  std::vector<Segment> segments;
  std::lock_guard lock(mutex_);
  auto object = objects_.find(fnv1a(identity));
  std::uint64_t at = begin;
  if (object != objects_.end()) {
    const Entries& entries = object->second;
    auto it = entries.upper_bound(at);
    if (it != entries.begin() && std::prev(it)->second.end > at) --it;
    for (; it != entries.end() && it->first < end; ++it) {
      if (it->first > at) segments.push_back({at, it->first, false});
      std::uint64_t stop = std::min(end, it->second.end);
      segments.push_back({std::max(at, it->first), stop, true});
      at = stop;
    }
  }
  if (at < end) segments.push_back({at, end, false});
  return segments;
}

bool DiskCache::load(const std::string& identity, std::uint64_t begin, std::span<std::byte> dst) {
  const std::uint64_t hash = fnv1a(identity);
  std::uint64_t entry_begin, entry_end;
  {
    std::lock_guard lock(mutex_);
    auto object = objects_.find(hash);
    if (object == objects_.end()) return false;
    auto it = object->second.upper_bound(begin);
    if (it == object->second.begin()) return false;
    --it;
    if (it->second.end < begin + dst.size()) return false;
    it->second.last_use = ++clock_;
    entry_begin = it->first, entry_end = it->second.end;
  }
  const bool whole = entry_begin == begin && entry_end == begin + dst.size();
  std::vector<std::byte> buffer(whole ? 0 : entry_end - entry_begin);
  std::span<std::byte> payload = whole ? dst : std::span<std::byte>(buffer);
  if (read_verified(file_of(hash, entry_begin, entry_end), identity, entry_begin, entry_end, payload)) {
    if (!whole) std::memcpy(dst.data(), buffer.data() + (begin - entry_begin), dst.size());
    return true;
  }
  std::lock_guard lock(mutex_);
  auto object = objects_.find(hash);
  if (object != objects_.end()) {
    auto it = object->second.find(entry_begin);
    if (it != object->second.end()) forget(hash, it);
  }
  return false;
}

void DiskCache::store(const std::string& identity, std::uint64_t begin, std::span<const std::byte> bytes) {
  const std::uint64_t hash = fnv1a(identity), end = begin + bytes.size();
  const std::uint64_t file_bytes = sizeof(Header) + identity.size() + bytes.size();
  fs::path target = file_of(hash, begin, end), temp;
  {
    std::lock_guard lock(mutex_);
    if (bytes.empty() || file_bytes > max_bytes_ || overlaps(objects_[hash], begin, end)) return;
    temp = target;
    temp += fmt::format(".tmp-{}-{}", ::getpid(), ++temp_counter_);
  }
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.begin = begin, h.end = end, h.checksum = checksum(bytes), h.identity_bytes = identity.size();
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  bool written = fd >= 0 && write_all(fd, &h, sizeof h) && write_all(fd, identity.data(), identity.size()) &&
                 write_all(fd, bytes.data(), bytes.size());
  if (fd >= 0) written = ::close(fd) == 0 && written;
  std::error_code ec;
  std::lock_guard lock(mutex_);
  Entries& entries = objects_[hash];
  if (!written || overlaps(entries, begin, end) || (fs::rename(temp, target, ec), ec)) {
    fs::remove(temp, ec);
    return;
  }
  entries.emplace(begin, Entry{end, file_bytes, ++clock_});
  bytes_ += file_bytes;
  evict_beyond_bound();
}

void DiskCache::forget(std::uint64_t hash, Entries::iterator it) {
  auto object = objects_.find(hash);
  std::error_code ec;
  fs::remove(file_of(hash, it->first, it->second.end), ec);
  bytes_ -= it->second.file_bytes;
  object->second.erase(it);
  if (object->second.empty()) objects_.erase(object);
}

void DiskCache::evict_beyond_bound() {
  while (bytes_ > max_bytes_) {
    std::uint64_t victim_hash = 0;
    Entries::iterator victim;
    std::uint64_t oldest = UINT64_MAX;
    for (auto& [hash, entries] : objects_)
      for (auto it = entries.begin(); it != entries.end(); ++it)
        if (it->second.last_use < oldest) oldest = it->second.last_use, victim_hash = hash, victim = it;
    if (oldest == UINT64_MAX) return;
    forget(victim_hash, victim);
  }
}

std::uint64_t DiskCache::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace ckptfs::s3
