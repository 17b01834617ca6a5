// Read-only access to source files. A File remembers what the file was when it was indexed (device,
// inode, size, mtime, ctime) and reads with pread through a bounded cache of open descriptors (its
// source's, which are its io::Runtime's: src/io/source_caches.hpp): thousands of rank files can be indexed
// and served under `ulimit -n 1024`, and a file whose descriptor was evicted is reopened on demand and
// checked to be the same file. A read or prefetch takes no process-wide lock: each File holds its open
// descriptor in a slot of its own (src/io/fd_cache.hpp) and its device's readahead size. A File can also be
// an object of an object store (a path below an s3:// source, io_tree.hpp's io::Source), read with ranged
// GETs pinned to its ETag.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "ckptfs/overloaded.hpp"

namespace ckptfs::io {

// What identifies a source file's content as indexed: a replacement (new inode) or a change in place
// (size, mtime or ctime) no longer matches. An object of an object store is its ETag, size and
// Last-Modified (as the listing spelled it); device, inode and the times stay 0.
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  std::string etag;
  std::string last_modified;
  bool operator==(const FileIdentity&) const = default;
};

// Who may read a source file as its directory entry says (owner, group, permission bits): what the mount
// shows for the nodes made of it (vfs::AccessRules). Objects of an object store have none.
struct Access {
  uid_t uid = 0;
  gid_t gid = 0;
  mode_t mode = 0;  // permission bits only (07777)
  bool operator==(const Access&) const = default;
};

// An open source descriptor; closed when the last holder lets go (the descriptor cache, a read in
// progress, a reply spliced from it).
class OpenFd {
 public:
  explicit OpenFd(int fd) : fd_(fd) {}
  ~OpenFd();
  OpenFd(const OpenFd&) = delete;
  OpenFd& operator=(const OpenFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

using OpenFdPtr = std::shared_ptr<const OpenFd>;

class DecodedItem;      // src/io/decoded_item.hpp
struct DescriptorSlot;  // src/io/fd_cache.hpp
class RemoteReader;     // src/io/remote_object.hpp
struct SourceCaches;    // src/io/source_caches.hpp

// Where a File's bytes come from, a closed kind visited wherever it matters (reads, splice eligibility,
// prefetch, identity checks, the index codec): the file at its path, read with pread through the
// descriptor cache; the decoded bytes of a compressed item of another file; or an object of an object
// store (ranged GETs pinned to the ETag the listing showed, src/io/remote_object.cpp).
struct OnDisk {
  std::shared_ptr<DescriptorSlot> slot;  // the open descriptor
  uint64_t readahead_bytes = 0;          // the device's readahead: one fadvise call's reach
  Access access;                         // as the file was when opened
};
struct Decoded {
  std::shared_ptr<const DecodedItem> item;
};
struct Remote {
  std::shared_ptr<RemoteReader> reader;  // the client, bucket, key and ETag, and a parse read-ahead
};
using Origin = std::variant<OnDisk, Decoded, Remote>;

inline constexpr uint64_t kRemoteReadGap = uint64_t{256} << 10;  // File::read_gap_bytes of an object
// The GET a prefetch of an object aims at (the block cache's block, s3::BlockCacheOptions::block_bytes):
// a store's cost is per request, so each is this large where the reader's needs allow.
inline constexpr uint64_t kRemoteRequestBytes = uint64_t{8} << 20;

// Bytes a parse took on trust instead of reading them (File::expect): `pieces` (offset, the bytes expected
// there) must hold before any byte of [guard_begin, guard_end) is served; `what` says what they are.
struct Expectation {
  uint64_t guard_begin = 0, guard_end = 0;
  std::vector<std::pair<uint64_t, std::string>> pieces;
  std::string what;
  bool operator==(const Expectation&) const = default;
};

class File {
 public:
  // Opens the local file at `path` read-only and records its identity; it reads through `caches` (those of
  // the source holding it: io::Source::open). Throws SourceError naming the path when it cannot be opened
  // or is not a regular file.
  static std::shared_ptr<File> open(const std::filesystem::path& path, std::shared_ptr<SourceCaches> caches);
  // A file outside any source (a unit test's, a file a command names apart from its source): caches of
  // its own, which keep its descriptor open.
  static std::shared_ptr<File> open_standalone(const std::filesystem::path& path);
  // The object of a store at `path` with the identity its source's listing showed, read through `reader`:
  // opening sends no request.
  static std::shared_ptr<File> object(std::filesystem::path path, FileIdentity identity,
                                      std::shared_ptr<RemoteReader> reader,
                                      std::shared_ptr<SourceCaches> caches);
  // The decoded bytes of a compressed item of another file, read as a file of their own: reads decode
  // what they touch (through the bounded cache of decoded items), the path and identity are those of
  // the file holding the item, and it is unchanged while that file is.
  static std::shared_ptr<File> decoded(std::shared_ptr<const DecodedItem> item);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::filesystem::path& path() const { return path_; }
  uint64_t size() const { return identity_.size; }
  int64_t mtime_ns() const { return identity_.mtime_ns; }
  const FileIdentity& identity() const { return identity_; }
  // Owner, group and mode of the file on disk when it was opened (a decoded item: its file's); nullopt for
  // an object, which has none.
  std::optional<Access> access() const;

  // Reads exactly dst.size() bytes at `offset` (retrying on EINTR and short reads). Throws SourceError
  // naming the file on an I/O error, when the range runs past the end of the file, or when the file
  // had to be reopened and is no longer the one indexed.
  void read_exact(uint64_t offset, std::span<std::byte> dst) const;
  std::vector<std::byte> read(uint64_t offset, uint64_t length) const;

  const Origin& origin() const { return origin_; }
  // The descriptor and decoded-item caches it reads through (a decoded item: its file's).
  SourceCaches& caches() const { return *caches_; }

  // Asks the kernel to start reading [offset, offset + length) into the page cache and returns without
  // waiting (posix_fadvise WILLNEED, one call per readahead size of the file's device, since the kernel
  // starts no more than that per call): reads that follow find it there. Best effort: errors are ignored.
  void prefetch(uint64_t offset, uint64_t length) const;

  // How many bytes between two ranges a parse wants cost less to read through than to skip with a request
  // of their own: 0 for a local file (a pread each), kRemoteReadGap for an object (a GET's latency buys
  // that many bytes).
  uint64_t read_gap_bytes() const;
  // Whether the bytes are an object of an object store (no kernel page cache or readahead under them).
  bool is_remote() const { return std::holds_alternative<Remote>(origin_); }

  // Over an object store each read is a request: a parse may place bytes where their format puts them
  // without reading what says so, and hand that here. An object checks the pieces at the first read of the
  // guarded range (a prefetch of it starts early enough to fetch them in its own request) and fails every
  // read of it with SourceError naming the object and `what` while they differ; any other file checks them
  // at once (SourceError).
  void expect(Expectation expectation) const;
  // Those not checked yet (the index keeps them: a mount from it checks them as this one would).
  std::vector<Expectation> expectations() const;

  // True while the file at path() still has the identity it had when opened (one stat).
  bool unchanged() const;
  // As unchanged(), but trusts a check that passed less than `interval` ago instead of making another
  // (a mount checks every source of a file on each open: a 1,024-rank view would cost 1,024 stats per
  // open). A file once found changed stays changed: its ctime never goes back (a stat that fails is no
  // finding: the next check tries again).
  bool unchanged_within(std::chrono::nanoseconds interval) const;

 private:
  friend class DiskFileRef;
  File(std::filesystem::path path, FileIdentity identity, std::shared_ptr<SourceCaches> caches);
  void read_on_disk(const OnDisk& disk, uint64_t offset, std::span<std::byte> dst) const;
  void prefetch_on_disk(const OnDisk& disk, uint64_t offset, uint64_t length) const;
  bool on_disk_unchanged_within(std::chrono::nanoseconds interval) const;
  // The file at path_ against the identity indexed: the same, another (changed), or no answer from stat.
  enum class DiskState { same, changed, unreadable };
  DiskState on_disk_state() const;
  const OnDisk& on_disk() const;  // throws std::logic_error for the other origins
  std::filesystem::path path_;
  FileIdentity identity_;
  std::shared_ptr<SourceCaches> caches_;
  Origin origin_;
  mutable std::atomic<int64_t> checked_at_ns_{INT64_MIN};  // steady clock of the last check passed
  mutable std::atomic<bool> changed_{false};
};

using FilePtr = std::shared_ptr<File>;

// A file on disk, held: what a reply spliced from the file (file -> pipe -> /dev/fuse) needs, made only for a
// File with a descriptor of its own (not an object, not a decoded item), and keeping it alive however long
// the reply takes.
class DiskFileRef {
 public:
  // `file`, held, when it is on disk; nullopt otherwise.
  static std::optional<DiskFileRef> of(FilePtr file);
  const File& file() const { return *file_; }
  // The file's open descriptor, held open while the result lives (reopened and checked as read_exact
  // does). Throws SourceError like read_exact.
  OpenFdPtr descriptor() const;
  // Throws SourceError naming the file unless `fd` (from descriptor()) still shows the identity indexed:
  // one fstat, for a reply spliced from it, which libfuse would send short (the fd read stops at the new
  // end) from a shard truncated since the mount, or with the new bytes of one rewritten in place.
  void check_descriptor(const OpenFd& fd) const;

 private:
  explicit DiskFileRef(FilePtr file) : file_(std::move(file)) {}
  FilePtr file_;
};

// Whether files read from one source tree are objects of a store: all of them are, or none.
inline bool reads_objects(std::span<const FilePtr> sources) {
  return !sources.empty() && sources.front()->is_remote();
}

// A byte range [base, base + length) of a source file read as a file of its own: a torch.save archive
// nested at an offset of a DCP .distcp file. Offsets given to read() are relative to base.
class FileRange {
 public:
  FileRange(FilePtr file);  // the whole file (implicit: a FilePtr is its own range)
  // Throws SourceError naming the file when the range runs past its end.
  FileRange(FilePtr file, uint64_t base, uint64_t length);

  const FilePtr& file() const { return file_; }
  const std::filesystem::path& path() const { return file_->path(); }
  uint64_t base() const { return base_; }
  uint64_t size() const { return length_; }
  // Bytes [offset, offset + length) of the range; SourceError when they run past its end.
  std::vector<std::byte> read(uint64_t offset, uint64_t length) const;
  // File::prefetch of bytes [offset, offset + length) of the range (clipped to it).
  void prefetch(uint64_t offset, uint64_t length) const;

 private:
  FilePtr file_;
  uint64_t base_ = 0;
  uint64_t length_ = 0;
};

// Raises the soft RLIMIT_NOFILE to the hard limit (as libfuse's passthrough_hp does); returns the new
// soft limit.
uint64_t raise_open_file_limit();

class Source;  // ckptfs/io_tree.hpp

// Opens each path of `source` once and hands out the same File for later requests. Opens run outside the
// lock, so the threads reading rank files in parallel do not wait for each other's open and fstat; two
// threads opening one path at once both open it, and the first to finish is the File both get.
class FileSet {
 public:
  explicit FileSet(const Source& source) : source_(source) {}
  FilePtr open(const std::filesystem::path& path);
  const Source& source() const { return source_; }

 private:
  const Source& source_;
  std::mutex mutex_;
  std::map<std::filesystem::path, FilePtr> files_;
};

}  // namespace ckptfs::io
