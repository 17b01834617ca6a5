// A compressed item of a source file (a DCP item saved through the ZStandard extension: one bare zstd
// frame) as a source of its decoded bytes. io::File::decoded() wraps one, so that torch archives,
// pieces and views read it like any file. A read decodes only the item it touches: whole items come
// from the cache of decoded items of the backing file's io::Runtime, bounded in bytes (io/decoded_cache.hpp,
// -o decoded_cache_mb); an item larger
// than the whole cache is decoded again for each read, streamed through a small buffer up to the end of
// the range asked for, so memory stays bounded whatever the checkpoint's size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "ckptfs/io.hpp"

namespace ckptfs::io {

class DecodedItem {
 public:
  // The zstd frame at [offset, offset + length) of `backing`. Its decoded size is the frame header's
  // content size or, when the writer did not record one (a streaming compressor), what a decoding pass
  // yields. Throws FormatError naming the file and the range when the bytes are not one whole zstd
  // frame.
  static std::shared_ptr<const DecodedItem> zstd(FilePtr backing, uint64_t offset, uint64_t length);

  const FilePtr& backing() const { return backing_; }
  uint64_t offset() const { return offset_; }
  uint64_t length() const { return length_; }
  uint64_t size() const { return size_; }  // decoded bytes

  // Decoded bytes [offset, offset + dst.size()), which lie inside size(). Throws SourceError naming the
  // file and the item when the frame no longer decodes (corrupt, or not the size it had).
  void read(uint64_t offset, std::span<std::byte> dst) const;
  // Asks the kernel for the compressed bytes (File::prefetch).
  void prefetch() const;

  DecodedItem(FilePtr backing, uint64_t offset, uint64_t length, uint64_t size);

 private:
  FilePtr backing_;
  uint64_t offset_, length_, size_;
  uint64_t id_;  // the cache's key (an address can be reused by a later item)
};

}  // namespace ckptfs::io
