// Logical tensors: merged tensors that exist nowhere on disk, described by where each run of their
// row-major elements comes from. Building a catalog reads no tensor data.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "ckptfs/dtype.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/overloaded.hpp"
#include "ckptfs/pickle.hpp"
#include "ckptfs/torch.hpp"

namespace ckptfs::catalog {

// Elements [dst_begin, dst_begin + count) of a logical tensor are `count` consecutive elements of type
// src_dtype starting at byte `src_offset` of `file` (a flat run).
struct Piece {
  uint64_t dst_begin = 0;
  uint64_t count = 0;
  io::FilePtr file;
  uint64_t src_offset = 0;
  DType src_dtype = DType::F32;
};

// An N-d chunk of a logical tensor held whole by one source tensor: the box [offsets, offsets + sizes)
// of the logical index space (a DCP chunk, a tensor-parallel slice). The source may have any strides.
struct LogicalTensor;

struct Box {
  std::vector<int64_t> offsets, sizes;
  torch::SourceTensor source;  // source.shape == sizes
  // When set, `source` is a view of this logical tensor's elements (its storage_offset and strides count
  // that tensor's elements; its storage is unused): a tensor-parallel slice that is itself merged from
  // data-parallel partitions.
  std::shared_ptr<const LogicalTensor> inner;
};

// The boxes that tile a logical tensor, indexed as a grid of the boxes' edges, so that the source runs
// of any element range are computed arithmetically: memory grows with the number of boxes, never with
// the number of rows (a column-split 8192 x 8192 tensor over 8 ranks is 8 boxes).
class BoxAssembly {
 public:
  // Throws FormatError naming `name` when a box lies outside `shape`, does not match its source's shape,
  // overlaps another, or when elements are covered by no box.
  BoxAssembly(const std::string& name, std::vector<int64_t> shape, std::vector<Box> boxes);

  // Appends the source runs of elements [first, first + count) as pieces (dst_begin = element index),
  // in order; each run is as long as both the logical and the source layout allow.
  void plan(uint64_t first, uint64_t count, std::vector<Piece>& out) const;
  const std::vector<Box>& boxes() const { return boxes_; }
  const std::vector<int64_t>& shape() const { return shape_; }

 private:
  size_t box_at(std::span<const int64_t> index) const;

  std::vector<int64_t> shape_;
  std::vector<Box> boxes_;
  std::vector<std::vector<int64_t>> edges_;  // per dimension: sorted distinct box edges, 0 and the extent
  std::vector<uint64_t> cell_strides_;       // row-major strides of the grid of cells between edges
  std::vector<uint32_t> cell_box_;           // the box covering each cell
  // Per box: the first dimension of its trailing block that is contiguous in both the logical tensor
  // (the box spans the whole extent of every later dimension) and the source (row-major strides);
  // the number of dimensions when the source's last dimension is strided.
  std::vector<size_t> block_dim_;
};

// Where a logical tensor's elements come from: one closed sum type, visited with an exhaustive set of
// overloads (ckptfs::Overloaded, no generic branch) wherever a form matters, so a new form compiles
// nowhere until every consumer handles it (docs/architecture.md, "How a read flows", lists them).
// Flat runs, sorted by dst_begin, disjoint, tiling [0, numel) exactly.
struct FlatRuns {
  std::vector<Piece> pieces;
};
// N-d boxes whose runs are planned per read (DCP chunks, tensor-parallel slices).
struct Boxed {
  std::shared_ptr<const BoxAssembly> assembly;
};
// The tiles of transposed tensors that one command's reads share (src/catalog/transposed_tile_cache.hpp):
// 8 tiles of at most an eighth of `bytes` each (at least 1 MiB; the mount's -o transpose_cache_mb=N), the
// pool of their buffers and the thread that builds a reader's next tile ahead. Each command makes its own
// and hands it to the transposed tensors it makes or loads (OpenOptions, vfs::GgufOptions).
class TransposeCache;
inline constexpr uint64_t kDefaultTransposeCacheBytes = uint64_t{128} << 20;
std::shared_ptr<TransposeCache> make_transpose_cache(uint64_t bytes = kDefaultTransposeCacheBytes);

// A 2-D tensor transposed (Hugging Face GPT-2's Conv1D weights), read through bounded tiles built with
// large source reads (src/catalog/transposed_reader.cpp), kept in `tiles`.
struct Transposed {
  std::shared_ptr<const LogicalTensor> of;
  std::shared_ptr<TransposeCache> tiles;
};
using TensorSource = std::variant<FlatRuns, Boxed, Transposed>;

// What a tensor is to the model, where the checkpoint tells (DeepSpeed's buffer_names and shared_params):
// a sharded view's index counts the parameters as save_pretrained's model.num_parameters() does, each once
// and no buffer. A format that does not tell leaves every tensor a parameter.
enum class ModelRole : uint8_t { parameter, buffer, tied_alias };

struct LogicalTensor {
  std::string name;
  DType dtype = DType::F32;  // the dtype it is served in; sources are converted to it when they differ
  std::vector<int64_t> shape;
  TensorSource source;
  std::string origin;  // provenance shown by `ckptfs inspect --tensors`
  ModelRole role = ModelRole::parameter;

  uint64_t numel() const;
  uint64_t nbytes() const { return numel() * dtype_size(dtype); }
  // The source files the elements come from, in order of first use.
  std::vector<io::FilePtr> files() const;
};

struct Catalog {
  std::vector<LogicalTensor> tensors;  // in the order the views lay them out (source order)
  uint64_t total_bytes() const;
};

// A tensor of a catalog by handle: it owns the catalog and names the tensor by its index, so it stays valid
// as long as it is held, whatever is appended to the catalog meanwhile.
struct TensorRef {
  std::shared_ptr<const Catalog> catalog;
  size_t index = 0;

  const LogicalTensor& operator*() const { return catalog->tensors[index]; }
  const LogicalTensor* operator->() const { return &catalog->tensors[index]; }
  explicit operator bool() const { return catalog != nullptr; }  // false: no tensor (default-constructed)
};

// A logical tensor inside a pickle value tree (a pickle::Native): what views that write general values
// (universal files, optimizer states) put where torch.save would write a tensor.
struct TensorValue {
  TensorRef tensor;
  std::vector<int64_t> shape;  // as pickled: tensor->shape, or a reshape with the same element count
  bool requires_grad = false;
};

// The logical tensor a value holds, or null.
const TensorValue* as_tensor_value(const pickle::Value& value);

// `tensor` as a pickle value (Kind::Native holding a TensorValue); `shape` defaults to tensor->shape.
pickle::ValuePtr tensor_value(TensorRef tensor, bool requires_grad = false,
                              std::optional<std::vector<int64_t>> shape = std::nullopt);

// A whole source tensor as a logical tensor served in `dtype`.
LogicalTensor whole_tensor(const std::string& name, const torch::SourceTensor& src, DType dtype,
                           std::string origin);

// Appends the pieces that make up `src` (any strides; contiguous runs are merged) as elements
// [dst_begin, dst_begin + src.numel()) of a logical tensor.
void append_source_tensor(std::vector<Piece>& pieces, uint64_t dst_begin, const torch::SourceTensor& src);

// Appends elements [first, first + count) of `src` taken in row-major order, as logical elements
// starting at dst_begin (a slice of a flat partition). Throws FormatError when the range exceeds src.
void append_source_range(std::vector<Piece>& pieces, uint64_t dst_begin, const torch::SourceTensor& src,
                         uint64_t first, uint64_t count);

// Boxes as building blocks of other logical tensors (tensor-parallel merges, a fused QKV split into q, k
// and v, a padded vocabulary trimmed, a stacked layer dimension taken apart): views only, no data read.

// A box source viewing every element of `tensor` in row-major order (set Box::inner to the tensor).
torch::SourceTensor element_view(const LogicalTensor& tensor);

// The run planner: appends the source runs of elements [first, first + count) of `tensor` (flat runs or
// boxes) as pieces whose dst_begin is the element index; for a transposed tensor, the runs of its source
// that the range is read from, dst_begin then being the source's element index (for prefetch and
// validation, not for placing bytes: a box over a transposed tensor is refused by validate).
void append_runs(const LogicalTensor& tensor, uint64_t first, uint64_t count, std::vector<Piece>& out);
// Whether append_runs gives runs that place `tensor`'s own elements (not for a transposed tensor, whose
// runs are its source's).
bool runs_place_elements(const LogicalTensor& tensor);

// Starts in the background what a read of elements [first, first + count) of `tensor` will need besides
// its source bytes (for prefetch): for a transposed tensor, the first of its tiles that starts in the range.
void build_ahead(const LogicalTensor& tensor, uint64_t first, uint64_t count);

// `src` restricted to [start, start + length) along dimension `dim`.
torch::SourceTensor narrow(const torch::SourceTensor& src, size_t dim, int64_t start, int64_t length);

// Appends the part of `tensor` (built from boxes) at [begin, end) along dimension `dim`, placed so that
// index `begin` lands at `dst_begin` of that dimension; other dimensions keep their offsets.
void append_slice(std::vector<Box>& out, const LogicalTensor& tensor, size_t dim, int64_t begin, int64_t end,
                  int64_t dst_begin);

// `tensor` (2-D) transposed, named `name`, its tiles kept in `tiles`.
LogicalTensor transposed_tensor(std::string name, const LogicalTensor& tensor,
                                std::shared_ptr<TransposeCache> tiles);

// A logical tensor tiled by `boxes`; throws FormatError naming `name` when they do not tile `shape` or a
// source cannot be served as `dtype`.
LogicalTensor assembled_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                               std::vector<Box> boxes, std::string origin);

// Checks the source: flat runs tile [0, numel) inside their files, a transposed tensor is its source's
// transpose and has a tile cache, no box views a transposed tensor (its runs place no bytes), and every
// conversion is supported (same dtype, a 16-bit float widened to F32, F32 rounded to BF16/F16). Throws
// FormatError naming the tensor.
void validate(const LogicalTensor& tensor);

// Bytes [offset, offset + length) of a source file on disk as they are (no conversion).
struct FileBytes {
  io::DiskFileRef file;
  uint64_t offset = 0;
};
// Bytes in memory that `holder` keeps alive (a tile of a transposed tensor, shared by the server threads).
struct HeldBytes {
  std::shared_ptr<const void> holder;
  const std::byte* data = nullptr;
};
// A run of a read left unread: `length` bytes that belong at `dst` of the caller's buffer, taken from a
// file or from memory that outlives the read. A server replies with them where they are (a splice from
// the file, an iovec of the memory) instead of copying them through its buffer.
struct DeferredRun {
  std::variant<FileBytes, HeldBytes> from;
  std::byte* dst = nullptr;
  uint64_t length = 0;
};

// Reads bytes [offset, offset + dst.size()) of `tensor` served in tensor.dtype. Reads only the source
// ranges it needs, coalescing adjacent runs into single preads, with bounded scratch memory. With
// `deferred`, runs of at least kMinDeferredRun bytes that need no conversion are appended to it (in order)
// instead of read, and so are the parts of a transposed tensor's tiles of at least kMinHeldRun bytes. Throws
// SourceError when a source file cannot be read or has changed since it was indexed.
void read_tensor(const LogicalTensor& tensor, uint64_t offset, std::span<std::byte> dst,
                 std::vector<DeferredRun>* deferred = nullptr);
inline constexpr uint64_t kMinDeferredRun = 16 << 10;  // below it, a copy costs less than a splice
inline constexpr uint64_t kMinHeldRun = 2 << 10;       // below it, a copy costs less than an iovec
inline constexpr size_t kMaxDeferredRuns = 256;  // a reply's runs beyond it are copied (IOV_MAX is 1024)

}  // namespace ckptfs::catalog
