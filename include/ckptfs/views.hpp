// Virtual files: sorted extents (inline bytes or byte ranges of logical tensors) that tile [0, size).
// Nothing is materialised; read(offset, length) is a binary search plus tensor reads.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "ckptfs/catalog.hpp"

namespace ckptfs::views {

class VirtualFile {
 public:
  virtual ~VirtualFile() = default;
  virtual uint64_t size() const = 0;
  // Fills dst with the bytes at [offset, offset + dst.size()); the range must lie inside [0, size()).
  // Throws SourceError when a source file cannot be read or changed since the mount.
  virtual void read(uint64_t offset, std::span<std::byte> dst) const = 0;
  // As read, except that runs copied unchanged from a source file may be left unread and appended to
  // `deferred` in order (catalog::read_tensor): the caller replies with them straight from the file.
  virtual void read_deferring(uint64_t offset, std::span<std::byte> dst,
                              std::vector<catalog::DeferredRun>& /*deferred*/) const {
    read(offset, dst);
  }
  // The distinct source files the bytes come from, so the caller can check whether they changed.
  virtual std::vector<io::FilePtr> sources() const { return {}; }
  // Starts reading the source ranges behind [offset, offset + length) into the page cache, in each source
  // file's order, without waiting (io::File::prefetch); files with nothing worth prefetching ignore it.
  virtual void prefetch(uint64_t /*offset*/, uint64_t /*length*/) const {}
  // What the reads of one open go to: null for the file itself; a file that keeps only indices and builds
  // its layout when read (universal/) builds it here, once per open, and returns it.
  virtual std::shared_ptr<const VirtualFile> open_layout() const { return nullptr; }
  // Appends the source runs a read of the whole file takes its bytes from (for inspect: what a view
  // reads from the source, or fetches from object storage); none for bytes held in memory.
  virtual void append_source_runs(std::vector<catalog::Piece>& /*out*/) const {}
  // Whether the bytes differ from one open to the next (made by open_layout, of a size known only then):
  // such a file is served without the page cache, and its size() is 0.
  virtual bool live() const { return false; }
};

using VirtualFilePtr = std::shared_ptr<const VirtualFile>;

// Where an extent's bytes come from: bytes held in memory (headers, pickles, zip records) ...
struct InlineBytes {
  std::shared_ptr<const std::string> bytes;  // the extent is bytes[offset, +length)
  uint64_t offset = 0;
};
// ... or a logical tensor's bytes [offset, +length), read from its sources.
struct TensorBytes {
  catalog::TensorRef tensor;
  uint64_t offset = 0;
};

// One extent of an ExtentFile.
struct Extent {
  uint64_t offset = 0;  // in the virtual file
  uint64_t length = 0;
  std::variant<InlineBytes, TensorBytes> source;
};

class ExtentFile final : public VirtualFile {
 public:
  // `extents` must tile [0, size) in order.
  explicit ExtentFile(std::vector<Extent> extents);
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, std::span<std::byte> dst) const override;
  void read_deferring(uint64_t offset, std::span<std::byte> dst,
                      std::vector<catalog::DeferredRun>& deferred) const override;
  std::vector<io::FilePtr> sources() const override;
  void prefetch(uint64_t offset, uint64_t length) const override;
  void append_source_runs(std::vector<catalog::Piece>& out) const override;
  const std::vector<Extent>& extents() const { return extents_; }

 private:
  void read_extents(uint64_t offset, std::span<std::byte> dst,
                    std::vector<catalog::DeferredRun>* deferred) const;
  // The ranges of each object-store source that the whole file needs, in order (built at the first prefetch).
  const std::vector<std::pair<uint64_t, uint64_t>>* needed_of_object(const io::File& file) const;

  std::vector<Extent> extents_;
  uint64_t size_ = 0;
  mutable std::once_flag needed_once_;
  mutable std::unordered_map<const io::File*, std::vector<std::pair<uint64_t, uint64_t>>> needed_;
};

// A safetensors file under the reference writer's rules: __metadata__ {"format":"pt"}, header padded
// with spaces to a multiple of 8, data section without holes; tensors in the writer's own order (its
// dtype enum descending, then name), so the bytes equal save_file's and loaders iterating keys() read it
// front to back.
VirtualFilePtr make_safetensors(std::shared_ptr<const catalog::Catalog> catalog);
// The same of the tensors of `catalog` at the indices `subset` (one shard of a sharded view).
VirtualFilePtr make_safetensors(std::shared_ptr<const catalog::Catalog> catalog,
                                std::span<const size_t> subset);

// A torch.save zip that torch.load(weights_only=True) accepts: protocol-2 pickle of a plain dict
// {name: tensor}, one storage record per tensor, records 64-byte aligned, CRC fields 0 (as torch's own
// compute_crc32=False writes), zip64 end records. `archive_name` is the top folder inside the zip
// ("pytorch_model" for pytorch_model.bin).
VirtualFilePtr make_torch_save(std::shared_ptr<const catalog::Catalog> catalog,
                               const std::string& archive_name);

// Calls visit(file, begin, end) for each range of a source file that `runs` cover, per file in file order,
// runs joined where they overlap or lie at most `join_gap` bytes apart. Sorts `runs`.
void for_each_source_range(std::vector<catalog::Piece>& runs, uint64_t join_gap,
                           const std::function<void(const io::File&, uint64_t, uint64_t)>& visit);

// `end` rounded up to a multiple of `unit`, but not past the end of the range of `needed` (sorted, disjoint
// [begin, end) ranges) that holds the byte before it: `end` itself when no range holds that byte.
uint64_t round_up_within(std::span<const std::pair<uint64_t, uint64_t>> needed, uint64_t end, uint64_t unit);

// The bytes of source files that `runs` cover, each byte once however many runs cover it.
uint64_t distinct_source_bytes(std::vector<catalog::Piece> runs);

// The distinct source files the tensors are read from, in order of first use.
std::vector<io::FilePtr> distinct_sources(std::span<const catalog::TensorRef> tensors);

// The names ckptfs itself takes at a mount's root (the description, the live figures, every tag's views):
// a side file of the same name is served as source/<name> instead.
inline constexpr std::string_view kInfoFile = "ckptfs.json";
inline constexpr std::string_view kStatsFile = "ckptfs-stats.json";
inline constexpr std::string_view kTagsDir = "tags";
inline constexpr std::array<std::string_view, 3> kRootNames = {kInfoFile, kStatsFile, kTagsDir};

// A small file held in memory (ckptfs.json, latest_universal).
VirtualFilePtr make_bytes_file(std::string bytes);

// A file whose bytes are make() at each open (ckptfs-stats.json), live() (see VirtualFile).
VirtualFilePtr make_live_file(std::function<std::string()> make);

// A source file served as is (side files such as config.json). Reads do not check whether the file
// changed; sources() returns it so the caller can check on open.
VirtualFilePtr make_passthrough(io::FilePtr file);

}  // namespace ckptfs::views
