#include "fuse/spliced_reply.hpp"

#include <cstdlib>
#include <memory>

#include "ckptfs/io.hpp"

namespace ckptfs::fuse {

namespace {

// A fuse_bufvec with room for `count` buffers (the struct declares one; libfuse reads bufv->count).
struct BufVecDeleter {
  void operator()(fuse_bufvec* v) const { std::free(v); }
};
using BufVecPtr = std::unique_ptr<fuse_bufvec, BufVecDeleter>;

BufVecPtr make_bufvec(size_t count) {
  const size_t bytes = sizeof(fuse_bufvec) + (count > 0 ? count - 1 : 0) * sizeof(fuse_buf);
  BufVecPtr v(static_cast<fuse_bufvec*>(std::calloc(1, bytes)));
  if (!v) throw std::bad_alloc();
  return v;
}

}  // namespace

void reply_with_runs(fuse_req_t req, std::span<const std::byte> buffer, const std::vector<catalog::DeferredRun>& runs) {
  BufVecPtr bufv = make_bufvec(2 * runs.size() + 1);
  std::vector<io::OpenFdPtr> held;  // every run's descriptor stays open until the reply is sent
  held.reserve(runs.size());
  const std::byte* at = buffer.data();
  const auto add_memory = [&](const std::byte* end) {
    if (end == at) return;
    fuse_buf& b = bufv->buf[bufv->count++];
    b.size = static_cast<size_t>(end - at);
    b.mem = const_cast<std::byte*>(at);  // libfuse only reads it
    at = end;
  };
  for (const auto& run : runs) {
    add_memory(run.dst);
    held.push_back(run.file->descriptor());
    fuse_buf& b = bufv->buf[bufv->count++];
    b.size = run.length;
    b.flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK | FUSE_BUF_FD_RETRY);
    b.fd = held.back()->get();
    b.pos = static_cast<off_t>(run.file_offset);
    at = run.dst + run.length;
  }
  add_memory(buffer.data() + buffer.size());
  // Never SPLICE_MOVE: the kernel would take pages out of the shards' own page cache.
  fuse_reply_data(req, bufv.get(), static_cast<fuse_buf_copy_flags>(0));
}

}  // namespace ckptfs::fuse
