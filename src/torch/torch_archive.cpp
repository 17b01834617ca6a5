#include <fmt/format.h>

#include "ckptfs/error.hpp"
#include "ckptfs/torch.hpp"
#include "torch/legacy_format.hpp"
#include "torch/zip_format.hpp"

namespace ckptfs::torch {

TorchArchive TorchArchive::open(io::FilePtr file) {
  TorchArchive archive;
  archive.file_ = file;
  const std::string path = file->path().string();
  try {
    archive.is_zip_ = is_zip_file(*file);
    if (archive.is_zip_) {
      archive.root_ = read_zip(file);
    } else if (is_legacy_file(*file)) {
      archive.root_ = read_legacy(file);
    } else {
      throw FormatError("not a torch.save file: no zip header and no legacy magic number");
    }
  } catch (const UnsupportedError& e) {
    throw UnsupportedError(fmt::format("{}: {}", path, e.what()));
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("{}: {}", path, e.what()));
  }
  return archive;
}

}  // namespace ckptfs::torch
