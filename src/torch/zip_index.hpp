// The central directory of a zip archive as torch.save writes it (zip64 tail, 64-byte aligned records),
// read from the end of the archive's byte range only (a whole file, or an item of a DCP .distcp file). Record
// data is located through each local header on demand, or placed where torch's writer puts it
// (torch_placement) without reading the header.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/io.hpp"

namespace ckptfs::torch {

struct ZipEntry {
  std::string name;  // full name, with the top folder
  uint16_t method = 0;
  uint16_t flags = 0;
  uint64_t compressed_size = 0;
  uint64_t size = 0;
  uint64_t local_header_offset = 0;
};

// Where a record's bytes sit, relative to the start of the archive's byte range.
struct RecordSpan {
  uint64_t offset = 0;
  uint64_t size = 0;
};

class ZipIndex {
 public:
  // Reads the end records and the central directory. Throws FormatError (without the file name).
  static ZipIndex read(const io::FileRange& file);

  // The top folder: what precedes the first '/' of the first central-directory entry.
  const std::string& root() const { return root_; }
  // The record `root/name`, or nullptr.
  const ZipEntry* find(std::string_view name) const;
  // Reads the record's local header and returns where its data is. Throws FormatError when the record is
  // compressed or encrypted, or its header or data lie outside the file.
  RecordSpan locate(const io::FileRange& file, const ZipEntry& entry) const;
  // locate() for many records at once, in their order: headers closer than the file's read gap
  // (io::File::read_gap_bytes: an object store's request costs more than the bytes between) are read in
  // one request.
  std::vector<RecordSpan> locate_all(const io::FileRange& file,
                                     const std::vector<const ZipEntry*>& entries) const;
  std::vector<std::byte> read(const io::FileRange& file, const ZipEntry& entry) const;

  // Where torch.save's writer (PyTorchStreamWriter) puts the record's data, without reading its local
  // header: after the 30 bytes of it, its name and an extra field (an "FB" id and length, then padding)
  // that pads the data to a multiple of 64. With it, the header bytes that place assumes (signature, name
  // and extra lengths, name) as an expectation, in the offsets of the file under `file` (base included).
  // nullopt for a record the writer gives zip64 fields (4 GiB and up) or whose data would not fit. Throws
  // as locate() for a compressed or encrypted record.
  struct TorchPlacement {
    RecordSpan span;
    io::Expectation header;
  };
  std::optional<TorchPlacement> torch_placement(const io::FileRange& file, const ZipEntry& entry) const;

 private:
  void check_stored(const ZipEntry& entry) const;
  RecordSpan span_from_local_header(const ZipEntry& entry, std::span<const std::byte> header,
                                    std::span<const std::byte> local_name) const;
  std::string root_;
  std::vector<ZipEntry> entries_;
  std::map<std::string, size_t, std::less<>> by_name_;
  uint64_t directory_offset_ = 0;  // records end where the central directory starts
};

}  // namespace ckptfs::torch
