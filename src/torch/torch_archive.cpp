#include <fmt/format.h>

#include "ckptfs/error.hpp"
#include "ckptfs/torch.hpp"
#include "torch/legacy_format.hpp"
#include "torch/zip_format.hpp"

namespace ckptfs::torch {

TorchArchive TorchArchive::open(const io::FileRange& range) {
  TorchArchive archive;
  archive.file_ = range.file();
  const bool whole_file = range.base() == 0 && range.size() == range.file()->size();
  // An archive nested in a bigger file (a DCP item) is named by its byte range in messages.
  const std::string where = whole_file ? range.path().string()
                                       : fmt::format("{} (bytes {}..{})", range.path().string(), range.base(),
                                                     range.base() + range.size());
  try {
    archive.is_zip_ = is_zip_file(range);
    if (archive.is_zip_) {
      archive.root_ = read_zip(range);
    } else if (whole_file && is_legacy_file(*range.file())) {
      archive.root_ = read_legacy(range.file());
    } else {
      throw FormatError("not a torch.save file: no zip header and no legacy magic number");
    }
  } catch (const UnsupportedError& e) {
    throw UnsupportedError(fmt::format("{}: {}", where, e.what()));
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("{}: {}", where, e.what()));
  }
  return archive;
}

}  // namespace ckptfs::torch
