// torch.save files (zip archives and the legacy pre-1.6 format) read without torch: the pickle is
// unpickled and every tensor becomes a SourceTensor that says where its bytes are, without reading them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckptfs/dtype.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/pickle.hpp"

namespace ckptfs::torch {

// Where one torch storage's raw bytes sit in a source file, already resolved through the zip.
struct StorageSpan {
  io::FilePtr file;
  uint64_t offset = 0;  // absolute byte offset in file
  uint64_t nbytes = 0;
};

// A tensor as one shard holds it: a (possibly strided) view of a storage.
struct SourceTensor {
  StorageSpan storage;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements
  int64_t storage_offset = 0;    // in elements
  bool requires_grad = false;

  uint64_t numel() const;
  bool is_contiguous() const;  // row-major contiguous (strides of size-1 dims ignored)
};

// What the unpickler pushes for _rebuild_tensor_v2/_v3, _rebuild_parameter, _rebuild_from_type_v2 (a
// pickle::Native).
struct TensorObject {
  SourceTensor tensor;
};

// The tensor a value holds, or nullptr.
const SourceTensor* as_tensor(const pickle::Value& value);
const SourceTensor* as_tensor(const pickle::Value* value);

class TorchArchive {
 public:
  // Reads the zip directory (or walks the legacy format) and unpickles data.pkl. Every bound is checked:
  // every tensor's storage lies inside the file and every view inside its storage. Throws FormatError
  // naming the file.
  // `range` is a whole file or, for a DCP item, the byte range of a .distcp file the archive occupies.
  static TorchArchive open(const io::FileRange& range);

  const pickle::ValuePtr& root() const { return root_; }
  const io::FilePtr& file() const { return file_; }
  bool is_zip() const { return is_zip_; }

 private:
  io::FilePtr file_;
  pickle::ValuePtr root_;
  bool is_zip_ = true;
};

}  // namespace ckptfs::torch
