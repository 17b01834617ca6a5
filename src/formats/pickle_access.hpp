// Typed access to unpickled state dicts and metadata (DeepSpeed, DCP). Every accessor names the file and
// the key path in its error: "file.pt: optimizer_state_dict.partition_count: expected int".
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/pickle.hpp"
#include "ckptfs/torch.hpp"

namespace ckptfs::formats {

class Field {
 public:
  Field(const pickle::Value* value, const std::filesystem::path* file, std::string path)
      : value_(value), file_(file), path_(std::move(path)) {}

  bool present() const { return value_ != nullptr && value_->kind != pickle::Kind::None; }
  const pickle::Value& value() const;  // throws when absent
  const std::string& path() const { return path_; }
  const std::filesystem::path* file() const { return file_; }

  Field operator[](std::string_view key) const;  // dict entry; absent when missing
  Field at(size_t index) const;                  // list/tuple item
  size_t size() const;                           // list/tuple length or dict entry count

  int64_t as_int() const;
  std::string as_string() const;
  std::vector<int64_t> as_shape() const;  // torch.Size, tuple or list of ints
  const torch::SourceTensor& as_tensor() const;
  // A ZeroStageEnum (pickled by value or by name) or a plain int.
  int64_t as_enum_int() const;
  bool is_list() const;
  bool is_dict() const;
  // Entries of a dict with string keys, in order.
  std::vector<std::pair<std::string, Field>> items() const;

  [[noreturn]] void fail(std::string_view problem) const;

 private:
  const pickle::Value* value_;
  const std::filesystem::path* file_;
  std::string path_;
};

// The root of a torch.save file as a Field.
inline Field root_field(const torch::TorchArchive& archive) {
  return Field(archive.root().get(), &archive.file()->path(), "");
}

}  // namespace ckptfs::formats
