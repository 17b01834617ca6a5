#include "fuse/operations.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <syslog.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <new>
#include <set>
#include <string_view>
#include <vector>

#include "fuse/spliced_reply.hpp"

namespace ckptfs::fuse {

namespace {

// How long the kernel may cache names, attributes and misses. A tree never changes: a snapshot's for long.
// A live mount replaces its tree and has the kernel drop what changed (InodeTable), but a lookup answered
// from the old tree while the new one is swapped in can land after that: a second bounds how long its answer
// stands.
double cache_timeout(const Context& c) {
  return c.live ? 1.0 : 86400.0;
}

const Context& context(fuse_req_t req) {
  return *static_cast<const Context*>(fuse_req_userdata(req));
}

// "a/b/c" of kernel inode `ino`, for log lines.
std::string path_of(const Context& c, fuse_ino_t ino) {
  const Resolved r = c.inodes->find(ino);
  return r.node != nullptr ? r.generation->tree->path(r.node->ino) : fmt::format("(inode {})", ino);
}

// Logs `message` unless the same file already failed for the same source: a changed or unreadable
// shard is reported once, not once per read of the thousands a loader makes.
void log_once(const Context& c, fuse_ino_t ino, std::string_view source, const std::string& message) {
  if (c.failures->first(ino, source)) log_error(c, message);
}

// Logs "op /path: what" (once per file and failing source: `what` starts with the source's path). Never
// throws: a failure to build the message (bad_alloc) only loses the log line.
void log_failure(const Context& c, fuse_ino_t ino, const char* op, std::string_view what) noexcept {
  try {
    log_once(c, ino, what.substr(0, what.find(": ")), fmt::format("{} /{}: {}", op, path_of(c, ino), what));
  } catch (...) {
  }
}

// Logs as log_failure does and replies `error`.
void fail(fuse_req_t req, fuse_ino_t ino, const char* op, const char* what, int error) noexcept {
  log_failure(context(req), ino, op, what);
  fuse_reply_err(req, error);
}

// Every callback runs inside this: whatever escapes becomes an errno reply, never a crash or a hang.
// `body` replies itself; it throws before replying or not at all.
template <class Body>
void guarded(fuse_req_t req, fuse_ino_t ino, const char* op, Body&& body) noexcept {
  try {
    body();
  } catch (const std::bad_alloc&) {
    fuse_reply_err(req, ENOMEM);
  } catch (const std::exception& e) {
    fail(req, ino, op, e.what(), EIO);
  } catch (...) {
    fail(req, ino, op, "unknown exception", EIO);
  }
}

struct stat attributes(const Context& c, const vfs::Node& node, fuse_ino_t ino) {
  struct stat st {};
  st.st_ino = ino;
  const mode_t permissions =
      c.access.umask ? (node.is_dir ? 0555 : 0444) & ~*c.access.umask : node.access.mode;
  st.st_mode = (node.is_dir ? S_IFDIR : S_IFREG) | permissions;
  st.st_nlink = node.is_dir ? 2 + node.subdirs : node.links;
  st.st_uid = c.access.uid.value_or(node.access.uid);
  st.st_gid = c.access.gid.value_or(node.access.gid);
  st.st_size = static_cast<off_t>(node.size());  // directories: 0, so `du -sb` sums the files exactly
  st.st_blocks = static_cast<blkcnt_t>((node.size() + 511) / 512);
  st.st_blksize = 1 << 20;  // hint for stdio and cp: large reads
  st.st_mtim = {static_cast<time_t>(node.mtime_ns / 1000000000),
                static_cast<long>(node.mtime_ns % 1000000000)};
  st.st_atim = st.st_ctim = st.st_mtim;
  return st;
}

fuse_entry_param entry(const Context& c, const vfs::Node& node, fuse_ino_t ino, bool cacheable) {
  fuse_entry_param e{};
  e.ino = ino;
  e.attr = attributes(c, node, ino);
  e.attr_timeout = e.entry_timeout = cacheable ? cache_timeout(c) : 0.0;
  return e;
}

void op_init(void*, fuse_conn_info* conn) {
  // The kernel caps readahead at the bdi's read_ahead_kb (docs/mount.md); ask for as much as it allows.
  conn->max_readahead = conn->max_readahead > (1u << 20) ? conn->max_readahead : (1u << 20);
  conn->max_background = 64;  // kernel default 12 throttles parallel readahead
  conn->congestion_threshold = 48;
  // Replies spliced from the source files (reply_with_runs); libfuse copies where the kernel cannot.
  conn->want |= conn->capable & FUSE_CAP_SPLICE_WRITE;
  // The largest request (max_pages follows max_write) whose reply fits a pipe of pipe-max-size (1 MiB
  // by default; only CAP_SYS_RESOURCE may grow one beyond): libfuse needs the reply plus a page per
  // buffer in one pipe to splice it, and copies it otherwise.
  conn->max_write = 512u << 10;
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  guarded(req, parent, "lookup", [&] {
    const Context& c = context(req);
    const Resolved dir = c.inodes->find(parent);
    if (dir.node == nullptr) return (void)fuse_reply_err(req, ENOENT);
    if (!dir.node->is_dir) return (void)fuse_reply_err(req, ENOTDIR);
    fuse_entry_param e{};  // ino 0: the kernel caches the miss for entry_timeout
    e.entry_timeout = c.inodes->cacheable(dir.generation) ? cache_timeout(c) : 0.0;
    if (const vfs::Node* node = dir.generation->tree->lookup(dir.node->ino, name))
      e = entry(c, *node, c.inodes->looked_up(dir.generation, node->ino),
                c.inodes->cacheable(dir.generation));
    // A reply the kernel did not take (the request was interrupted) hands it no reference.
    if (fuse_reply_entry(req, &e) != 0 && e.ino != 0) c.inodes->forget(e.ino, 1);
  });
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  guarded(req, ino, "getattr", [&] {
    const Context& c = context(req);
    const Resolved r = c.inodes->find(ino);
    if (r.node == nullptr) return (void)fuse_reply_err(req, ENOENT);
    const struct stat st = attributes(c, *r.node, ino);
    fuse_reply_attr(req, &st, cache_timeout(c));
  });
}

// readdir and readdirplus: offsets are entry indexes (0 ".", 1 "..", 2.. children), stable because a
// tree never changes (a listing of a directory a live mount changed since its opendir is of the tree it
// was started on: the directory handle holds it).
void read_directory(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, fuse_file_info* fi,
                    bool plus) {
  guarded(req, ino, "readdir", [&] {
    const Context& c = context(req);
    const auto* listed = reinterpret_cast<const Resolved*>(fi->fh);
    const Resolved found = listed != nullptr ? Resolved{} : c.inodes->find(ino);
    const Resolved& r = listed != nullptr ? *listed : found;
    const vfs::Node* dir = r.node;
    if (dir == nullptr) return (void)fuse_reply_err(req, ENOENT);
    if (!dir->is_dir) return (void)fuse_reply_err(req, ENOTDIR);
    const vfs::VirtualTree& tree = *r.generation->tree;
    const std::vector<KernelIno>& kernel = r.generation->kernel;
    thread_local std::vector<char> buffer;  // per worker thread, as large as the largest request
    if (buffer.size() < size) buffer.resize(size);
    size_t used = 0;
    const size_t count = dir->children.size() + 2;
    std::vector<fuse_ino_t> handed;  // readdirplus: the entries that take a lookup reference
    const bool listing_cacheable = !plus || c.inodes->cacheable(r.generation);
    for (size_t i = static_cast<size_t>(std::max<off_t>(offset, 0)); i < count; ++i) {
      const vfs::Ino local = i < 2 ? (i == 0 ? dir->ino : dir->parent) : dir->children[i - 2].second;
      const vfs::Node* node = tree.node(local);
      const fuse_ino_t node_ino = i == 0 ? ino : kernel[local];
      const char* name = i == 0 ? "." : i == 1 ? ".." : dir->children[i - 2].first.c_str();
      const off_t next = static_cast<off_t>(i + 1);
      size_t n;
      if (plus) {
        const fuse_entry_param e = entry(c, *node, node_ino, listing_cacheable);
        n = fuse_add_direntry_plus(req, buffer.data() + used, size - used, name, &e, next);
      } else {
        const struct stat st = attributes(c, *node, node_ino);
        n = fuse_add_direntry(req, buffer.data() + used, size - used, name, &st, next);
      }
      if (n > size - used) break;  // did not fit: the kernel asks again from `next - 1`
      used += n;
      if (plus && i >= 2) handed.push_back(c.inodes->looked_up(r.generation, local));
    }
    if (fuse_reply_buf(req, buffer.data(), used) != 0)
      for (fuse_ino_t h : handed) c.inodes->forget(h, 1);
  });
}

// A snapshot's directories never change: the kernel may keep their listings (cache_readdir), so a second
// `ls -lR` or `du` of a large tree is served without a READDIR round trip per block of entries. A live
// mount's are listed afresh by each opendir: a READDIR of an older handle answered after the kernel dropped
// a listing would cache the old one again, for every later opendir. The handle holds the directory's tree.
void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  guarded(req, ino, "opendir", [&] {
    const Context& c = context(req);
    auto listed = std::make_unique<Resolved>(c.inodes->find(ino));
    if (listed->node == nullptr) return (void)fuse_reply_err(req, ENOENT);
    if (!listed->node->is_dir) return (void)fuse_reply_err(req, ENOTDIR);
    fi->cache_readdir = !c.live;
    fi->keep_cache = !c.live;
    fi->fh = reinterpret_cast<uint64_t>(listed.get());
    if (fuse_reply_open(req, fi) == 0) listed.release();
  });
}

void op_releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  delete reinterpret_cast<Resolved*>(fi->fh);
  fuse_reply_err(req, 0);
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, fuse_file_info* fi) {
  read_directory(req, ino, size, offset, fi, false);
}

void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, fuse_file_info* fi) {
  read_directory(req, ino, size, offset, fi, true);
}

void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  context(req).inodes->forget(ino, nlookup);
  fuse_reply_none(req);
}

void op_forget_multi(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) context(req).inodes->forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  guarded(req, ino, "open", [&] {
    const Context& c = context(req);
    const Resolved r = c.inodes->find(ino);
    const vfs::Node* node = r.node;
    if (node == nullptr) return (void)fuse_reply_err(req, ENOENT);
    if (node->is_dir) return (void)fuse_reply_err(req, EISDIR);
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC) != 0)
      return (void)fuse_reply_err(req, EROFS);
    // Each source is stat'ed at most once per interval (io::File::unchanged_within), however many opens:
    // a loader's open-read-close loop over a 1,024-rank view does not stat 1,024 files per open.
    for (const auto& source : node->sources) {
      if (!source->unchanged_within(c.source_check_interval)) {
        log_once(c, ino, source->path().string(),
                 fmt::format("open /{}: {}: changed since the mount (replaced, or its size, mtime or ctime "
                             "differ); remount to serve the new checkpoint",
                             r.generation->tree->path(node->ino), source->path().string()));
        return (void)fuse_reply_err(req, EIO);
      }
    }
    // Immutable content: pages stay cached across opens; mmap stays shareable. A live file's bytes are
    // made at open (its size only known then): each read goes to the server.
    fi->keep_cache = !node->file->live();
    fi->direct_io = node->file->live();
    fi->fh = reinterpret_cast<uint64_t>(c.open_files->open(
        ino, node->file, [&] { return prefetch_window(*node, c.prefetch_bytes, c.remote_cache_bytes); }));
    fuse_reply_open(req, fi);
  });
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, fuse_file_info* fi) {
  guarded(req, ino, "read", [&] {
    const Context& c = context(req);
    const Resolved r = c.inodes->find(ino);
    const vfs::Node* node = r.node;
    if (node == nullptr || node->is_dir) return (void)fuse_reply_err(req, node == nullptr ? ENOENT : EISDIR);
    OpenFile* open = fi != nullptr && fi->fh != 0 ? reinterpret_cast<OpenFile*>(fi->fh) : nullptr;
    const views::VirtualFile& content = open != nullptr ? *open->content : *node->file;
    const uint64_t file_size = content.size();  // a live file's, of this open
    const uint64_t start = static_cast<uint64_t>(std::max<off_t>(offset, 0));
    if (start >= file_size) return (void)fuse_reply_buf(req, nullptr, 0);
    const size_t length = static_cast<size_t>(std::min<uint64_t>(size, file_size - start));
    // One buffer per worker thread, as large as the largest request it served (max_read bounds it).
    thread_local std::vector<std::byte> buffer;
    if (buffer.size() < length) buffer.resize(length);
    if (open != nullptr && c.prefetch_bytes > 0)
      c.open_files->prefetch_for_read(*open, start, length, file_size);
    // Source bytes that need no conversion are not read here: the reply takes them from the files.
    thread_local std::vector<catalog::DeferredRun> deferred;
    deferred.clear();
    const struct Release {  // the tiles a run holds go back to their cache's bounds once the reply is sent
      ~Release() { deferred.clear(); }
    } release;
    content.read_deferring(start, std::span(buffer.data(), length), deferred);
    if (!node->file->live()) r.generation->served[node->ino].fetch_add(length, std::memory_order_relaxed);
    if (deferred.empty())
      fuse_reply_buf(req, reinterpret_cast<const char*>(buffer.data()), length);
    else if (const std::string problem = reply_with_runs(req, std::span(buffer.data(), length), deferred);
             !problem.empty())
      log_failure(c, ino, "read", problem);  // answered (req is gone): only the log line is left to give
  });
}

void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  context(req).open_files->release(ino);
  fuse_reply_err(req, 0);
}

void op_statfs(fuse_req_t req, fuse_ino_t ino) {
  guarded(req, ino, "statfs", [&] {
    const vfs::VirtualTree& tree = *context(req).inodes->current()->tree;
    struct statvfs st {};
    st.f_bsize = st.f_frsize = 4096;
    st.f_blocks = (tree.total_bytes() + 4095) / 4096;
    st.f_files = tree.node_count();
    st.f_namemax = 255;
    st.f_flag = ST_RDONLY;
    fuse_reply_statfs(req, &st);
  });
}

void op_getxattr(fuse_req_t req, fuse_ino_t, const char*, size_t) {
  fuse_reply_err(req, ENOTSUP);
}

void op_listxattr(fuse_req_t req, fuse_ino_t, size_t size) {
  if (size == 0) {
    fuse_reply_xattr(req, 0);
  } else {
    fuse_reply_buf(req, nullptr, 0);
  }
}

// Fills any write-type slot of fuse_lowlevel_ops with a callback of its exact signature that replies EROFS.
template <class Fn>
struct ReadOnly;
template <class... Args>
struct ReadOnly<void (*)(fuse_req_t, Args...)> {
  static void reply(fuse_req_t req, Args...) { fuse_reply_err(req, EROFS); }
};
template <class Fn>
void refuse(Fn& slot) {
  slot = &ReadOnly<Fn>::reply;
}

}  // namespace

void log_error(const Context& c, const std::string& message) {
  std::fprintf(stderr, "ckptfs: %s\n", message.c_str());
  if (c.use_syslog) syslog(LOG_ERR, "%s", message.c_str());
}

fuse_lowlevel_ops make_operations() {
  fuse_lowlevel_ops ops{};
  ops.init = op_init;
  ops.lookup = op_lookup;
  ops.forget = op_forget;
  ops.forget_multi = op_forget_multi;
  ops.getattr = op_getattr;
  ops.opendir = op_opendir;
  ops.releasedir = op_releasedir;
  ops.readdir = op_readdir;
  ops.readdirplus = op_readdirplus;
  ops.open = op_open;
  ops.read = op_read;
  ops.release = op_release;
  ops.statfs = op_statfs;
  ops.getxattr = op_getxattr;
  ops.listxattr = op_listxattr;
  refuse(ops.setattr);
  refuse(ops.mknod);
  refuse(ops.mkdir);
  refuse(ops.unlink);
  refuse(ops.rmdir);
  refuse(ops.symlink);
  refuse(ops.rename);
  refuse(ops.link);
  refuse(ops.write);
  refuse(ops.create);
  refuse(ops.setxattr);
  refuse(ops.removexattr);
  refuse(ops.fallocate);
  refuse(ops.copy_file_range);
  return ops;
}

}  // namespace ckptfs::fuse
