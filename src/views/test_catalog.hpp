// Test helper: a catalog of tensors of given names, dtypes and shapes, each read from its own source file
// of random bytes, so a view's tensor bytes can be compared with the file contents.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "catalog/test_sources.hpp"
#include "ckptfs/catalog.hpp"

namespace ckptfs::testing {

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

class TestCatalog {
 public:
  explicit TestCatalog(const std::vector<TensorSpec>& specs) {
    std::mt19937 rng(42);
    auto c = std::make_shared<catalog::Catalog>();
    for (const auto& s : specs) {
      catalog::LogicalTensor t;
      t.name = s.name;
      t.dtype = s.dtype;
      t.shape = s.shape;
      std::vector<std::byte> bytes(t.nbytes() + 1);  // never empty: a file is opened for every tensor
      for (auto& b : bytes) b = static_cast<std::byte>(rng());
      files_.push_back(std::make_unique<SourceFile>(bytes));
      std::vector<catalog::Piece> pieces;
      if (t.numel() > 0)
        pieces.push_back(
            {.count = t.numel(), .file = files_.back()->file(), .src_offset = 1, .src_dtype = t.dtype});
      t.source = catalog::FlatRuns{std::move(pieces)};
      c->tensors.push_back(std::move(t));
    }
    catalog_ = std::move(c);
  }
  const std::shared_ptr<const catalog::Catalog>& catalog() const { return catalog_; }
  // The bytes tensor i is served as.
  std::string bytes(size_t i) const {
    const auto& b = files_[i]->bytes();
    return std::string(reinterpret_cast<const char*>(b.data()) + 1, b.size() - 1);
  }

 private:
  std::vector<std::unique_ptr<SourceFile>> files_;
  std::shared_ptr<const catalog::Catalog> catalog_;
};

inline std::string read_file(const views::VirtualFile& f, uint64_t offset, uint64_t length) {
  std::string out(length, '\0');
  f.read(offset, std::as_writable_bytes(std::span(out)));
  return out;
}

inline uint64_t le(std::string_view bytes, size_t offset, int n) {
  uint64_t v = 0;
  for (int i = n; i-- > 0;) v = v << 8 | static_cast<uint8_t>(bytes[offset + i]);
  return v;
}

}  // namespace ckptfs::testing
