#include "fuse/spliced_reply.hpp"

#include <fmt/format.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "ckptfs/error.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/overloaded.hpp"

namespace ckptfs::fuse {

namespace {

// A fuse_bufvec with room for `count` buffers (the struct declares one; libfuse reads bufv->count), empty.
// One per server thread, grown to the largest reply it sent: a read allocates nothing.
struct BufVecDeleter {
  void operator()(fuse_bufvec* v) const { std::free(v); }
};

fuse_bufvec& empty_bufvec(size_t count) {
  thread_local std::unique_ptr<fuse_bufvec, BufVecDeleter> v;
  thread_local size_t capacity = 0;
  if (capacity < count) {
    const size_t bytes = sizeof(fuse_bufvec) + (count - 1) * sizeof(fuse_buf);
    v.reset(static_cast<fuse_bufvec*>(std::malloc(bytes)));
    capacity = v ? count : 0;
    if (!v) throw std::bad_alloc();
  }
  v->count = v->idx = v->off = 0;
  return *v;
}

// A run's file with its descriptor, held open and checked once per reply however many runs it gives.
struct HeldSource {
  io::DiskFileRef file;
  io::OpenFdPtr fd;
};

int held_descriptor(std::vector<HeldSource>& held, const io::DiskFileRef& file) {
  for (const auto& h : held)
    if (&h.file.file() == &file.file()) return h.fd->get();
  io::OpenFdPtr fd = file.descriptor();
  file.check_descriptor(*fd);
  held.push_back({file, std::move(fd)});
  return held.back().fd->get();
}

// What went wrong once fuse_reply_data returned `sent` (empty: nothing).
std::string after_reply(int sent, size_t bytes, const std::vector<HeldSource>& held) {
  // -ENOENT: the request was interrupted, the kernel no longer waits for it.
  if (sent == -ENOENT) return {};
  if (sent != 0) return fmt::format("reply of {} bytes not sent: {}", bytes, std::strerror(std::abs(sent)));
  // A file that changed between the check and the splice: its fd read stopped early and libfuse sent
  // what it had, which the reader takes for the end of the file. Too late for EIO; at least say so.
  for (const auto& h : held) {
    try {
      h.file.check_descriptor(*h.fd);
    } catch (const SourceError& e) {
      return fmt::format("{} (while a reply was spliced from it: that reply may have been short)", e.what());
    }
  }
  return {};
}

// after_reply for a request answered and gone: nothing may escape to the caller's error reply.
std::string reported(int sent, size_t bytes, const std::vector<HeldSource>& held) noexcept {
  try {
    return after_reply(sent, bytes, held);
  } catch (...) {
    return {};  // bad_alloc while building the message: only the log line is lost
  }
}

// Calls memory(data, size) and file(bytes, size) for the parts of the reply in order: the caller's buffer
// between the runs, and each run from where it is.
template <class Memory, class File>
void for_each_part(std::span<const std::byte> buffer, const std::vector<catalog::DeferredRun>& runs,
                   Memory memory, File file) {
  const std::byte* at = buffer.data();
  for (const auto& run : runs) {
    if (run.dst != at) memory(at, static_cast<size_t>(run.dst - at));
    std::visit(Overloaded{[&](const catalog::FileBytes& bytes) { file(bytes, run.length); },
                          [&](const catalog::HeldBytes& bytes) { memory(bytes.data, run.length); }},
               run.from);
    at = run.dst + run.length;
  }
  if (at != buffer.data() + buffer.size())
    memory(at, static_cast<size_t>(buffer.data() + buffer.size() - at));
}

// A reply whose runs are all in memory goes out in one writev of iovecs over them: libfuse would copy a
// bufvec of several memory buffers into one of its own first.
std::string reply_from_memory(fuse_req_t req, std::span<const std::byte> buffer,
                              const std::vector<catalog::DeferredRun>& runs) {
  thread_local std::vector<iovec> iov;
  iov.clear();
  for_each_part(
      buffer, runs,
      [&](const std::byte* data, size_t size) {
        iov.push_back({const_cast<std::byte*>(data), size});  // only read
      },
      [](const catalog::FileBytes&, size_t) {});
  return reported(fuse_reply_iov(req, iov.data(), static_cast<int>(iov.size())), buffer.size(), {});
}

}  // namespace

std::string reply_with_runs(fuse_req_t req, std::span<const std::byte> buffer,
                            const std::vector<catalog::DeferredRun>& runs) {
  if (std::all_of(runs.begin(), runs.end(),
                  [](const auto& r) { return std::holds_alternative<catalog::HeldBytes>(r.from); }))
    return reply_from_memory(req, buffer, runs);
  fuse_bufvec* const bufv = &empty_bufvec(2 * runs.size() + 1);
  // Every run's descriptor stays open until the reply is sent; the vector is the thread's, reused.
  thread_local std::vector<HeldSource> held;
  held.clear();
  const struct Release {
    ~Release() { held.clear(); }
  } release;
  const auto add_memory = [&](const std::byte* data, size_t size) {
    fuse_buf& b = bufv->buf[bufv->count++];
    b = fuse_buf{};
    b.size = size;
    b.mem = const_cast<std::byte*>(data);  // libfuse only reads it
  };
  for_each_part(buffer, runs, add_memory, [&](const catalog::FileBytes& bytes, size_t size) {
    fuse_buf& b = bufv->buf[bufv->count++];
    b = fuse_buf{};
    b.size = size;
    b.flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK | FUSE_BUF_FD_RETRY);
    b.fd = held_descriptor(held, bytes.file);
    b.pos = static_cast<off_t>(bytes.offset);
  });
  // Never SPLICE_MOVE: the kernel would take pages out of the shards' own page cache.
  return reported(fuse_reply_data(req, bufv, static_cast<fuse_buf_copy_flags>(0)), buffer.size(), held);
}

}  // namespace ckptfs::fuse
