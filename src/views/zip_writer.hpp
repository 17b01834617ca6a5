// The byte layout of a STORED zip64 archive as torch.save writes it (PyTorchStreamWriter + miniz): every
// header is computed from record names and sizes alone, so tensor records stay references to tensors.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "views/extent_builder.hpp"

namespace ckptfs::views {

struct ZipRecord {
  std::string name;                                       // inside the top folder: "data.pkl", "data/0"
  std::variant<std::string, catalog::TensorRef> content;  // a small record's bytes, or a tensor's
};

inline constexpr uint64_t kZipAlignment = 64;  // torch's default .storage_alignment

// Appends the archive `root/<name>` for every record, in order: local headers with an 'FB' padding extra
// that puts each record's data at a multiple of kZipAlignment from the archive start, data descriptors,
// the central directory and the zip64 end records. CRC fields are 0, as torch writes with
// compute_crc32=False (torch.load never checks them).
void append_zip(ExtentBuilder& out, std::string_view root, std::span<const ZipRecord> records);

}  // namespace ckptfs::views
