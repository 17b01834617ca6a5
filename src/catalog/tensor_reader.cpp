// read_tensor: plans the source runs behind a byte range of a logical tensor, reads each run of pieces
// that sit back to back in one file with a single pread, and converts dtypes through a bounded,
// per-thread scratch buffer. Nothing is shared between calls (but the tiles of transposed tensors, in their
// TransposeCache: transposed_tile_cache.hpp), so any number of threads may read at once.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "catalog/dtype_convert.hpp"
#include "catalog/transposed_reader.hpp"
#include "ckptfs/catalog.hpp"

namespace ckptfs::catalog {

namespace {

constexpr size_t kScratchBytes = size_t{4} << 20;

// True when b's source bytes follow a's in the same file (one pread covers both).
bool continues(const Piece& a, const Piece& b) {
  return a.file == b.file && a.src_dtype == b.src_dtype &&
         a.src_offset + a.count * dtype_size(a.src_dtype) == b.src_offset;
}

// Reads `count` source elements of `dtype` at `src_offset` and writes them converted into `out`.
void read_converted(const io::File& file, uint64_t src_offset, DType from, DType to, uint64_t count,
                    std::span<std::byte> out) {
  thread_local std::vector<std::byte> scratch;
  const uint64_t in_size = dtype_size(from), out_size = dtype_size(to);
  const uint64_t chunk = kScratchBytes / in_size;
  if (scratch.size() < std::min(count, chunk) * in_size) scratch.resize(std::min(count, chunk) * in_size);
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(count - done, chunk);
    const auto in = std::span(scratch).first(n * in_size);
    file.read_exact(src_offset + done * in_size, in);
    convert(from, to, in, out.subspan(done * out_size, n * out_size));
    done += n;
  }
}

// Writes elements [first, first + count) of `tensor`, whose runs are `pieces` (sorted by dst_begin, covering
// the range), into `out` (count * element size bytes), or defers the runs read_tensor may defer.
void read_runs(const LogicalTensor& tensor, const std::vector<Piece>& pieces, uint64_t first, uint64_t count,
               std::span<std::byte> out, std::vector<DeferredRun>* deferred) {
  const uint64_t out_size = dtype_size(tensor.dtype);
  auto it = std::upper_bound(pieces.begin(), pieces.end(), first,
                             [](uint64_t e, const Piece& p) { return e < p.dst_begin; });
  size_t i = static_cast<size_t>(it - pieces.begin()) - 1;
  while (count > 0) {
    if (i >= pieces.size())
      throw std::logic_error(fmt::format("tensor {}: pieces do not cover it", tensor.name));
    // One run: from `first` inside piece i through every following piece its bytes continue into.
    const Piece& p = pieces[i];
    const uint64_t src_offset = p.src_offset + (first - p.dst_begin) * dtype_size(p.src_dtype);
    uint64_t n = std::min(count, p.dst_begin + p.count - first);
    while (n < count && i + 1 < pieces.size() && continues(pieces[i], pieces[i + 1])) {
      ++i;
      n += std::min(count - n, pieces[i].count);
    }
    ++i;
    const auto dst = out.first(n * out_size);
    std::optional<io::DiskFileRef> on_disk;
    if (p.src_dtype == tensor.dtype && deferred != nullptr && dst.size() >= kMinDeferredRun &&
        deferred->size() < kMaxDeferredRuns && (on_disk = io::DiskFileRef::of(p.file)))
      deferred->push_back({FileBytes{std::move(*on_disk), src_offset}, dst.data(), dst.size()});
    else if (p.src_dtype == tensor.dtype)
      p.file->read_exact(src_offset, dst);
    else
      read_converted(*p.file, src_offset, p.src_dtype, tensor.dtype, n, dst);
    out = out.subspan(dst.size());
    first += n;
    count -= n;
  }
}

// Writes elements [first, first + count) of `tensor` into `out`, or defers the runs read_tensor may defer.
void read_elements(const LogicalTensor& tensor, uint64_t first, uint64_t count, std::span<std::byte> out,
                   std::vector<DeferredRun>* deferred = nullptr) {
  std::visit(Overloaded{
                 [&](const FlatRuns& flat) { read_runs(tensor, flat.pieces, first, count, out, deferred); },
                 [&](const Boxed& boxed) {
                   thread_local std::vector<Piece> planned;  // for this request only
                   planned.clear();
                   boxed.assembly->plan(first, count, planned);
                   read_runs(tensor, planned, first, count, out, deferred);
                 },
                 [&](const Transposed& transposed) {
                   read_transposed(tensor, transposed, first, count, out, deferred);
                 },
             },
             tensor.source);
}

}  // namespace

void read_tensor(const LogicalTensor& tensor, uint64_t offset, std::span<std::byte> dst,
                 std::vector<DeferredRun>* deferred) {
  const uint64_t size = dtype_size(tensor.dtype);
  if (offset > tensor.nbytes() || dst.size() > tensor.nbytes() - offset)
    throw std::out_of_range(fmt::format("tensor {}: read of {} bytes at offset {} past its {} bytes",
                                        tensor.name, dst.size(), offset, tensor.nbytes()));
  // Elements cut by either end of the request are read whole into a small buffer, the rest in place.
  const auto partial = [&](uint64_t element, uint64_t skip) {
    std::array<std::byte, 16> buffer;
    read_elements(tensor, element, 1, std::span(buffer).first(size));
    const size_t n = std::min<uint64_t>(size - skip, dst.size());
    std::memcpy(dst.data(), buffer.data() + skip, n);
    dst = dst.subspan(n);
  };
  if (!dst.empty() && (offset % size != 0 || dst.size() < size)) partial(offset / size, offset % size);
  const uint64_t first = (offset + size - 1) / size;
  const uint64_t whole = dst.size() / size;
  if (whole > 0) read_elements(tensor, first, whole, dst.first(whole * size), deferred);
  dst = dst.subspan(whole * size);
  if (!dst.empty()) partial(first + whole, 0);
}

}  // namespace ckptfs::catalog
