#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "ckptfs/error.hpp"
#include "ckptfs/torch.hpp"
#include "torch/test_support.hpp"

namespace ckptfs::torch {
namespace {

const std::filesystem::path kLegacy =
    std::filesystem::path(CKPTFS_SOURCE_DIR) / "src/torch/testdata/legacy.pt";

std::vector<float> floats(const SourceTensor& t) {
  auto bytes = t.storage.file->read(t.storage.offset, t.storage.nbytes);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

TEST(LegacyFormat, ReadsTorch113File) {
  auto archive = TorchArchive::open(io::File::open_standalone(kLegacy));
  EXPECT_FALSE(archive.is_zip());
  const auto& root = *archive.root();
  EXPECT_EQ(root.find("n")->integer, 3);
  const auto* w = as_tensor(root.find("w"));
  const auto* view = as_tensor(root.find("view"));
  const auto* i = as_tensor(root.find("i"));
  const auto* h = as_tensor(root.find("h"));
  ASSERT_TRUE(w && view && i && h);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(floats(*w), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(view->storage.offset, w->storage.offset);
  EXPECT_EQ(view->storage_offset, 6);
  EXPECT_EQ(view->strides, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(i->dtype, DType::I64);
  auto ib = i->storage.file->read(i->storage.offset, 16);
  int64_t values[2];
  std::memcpy(values, ib.data(), 16);
  EXPECT_EQ(values[0], 7);
  EXPECT_EQ(values[1], -8);
  EXPECT_EQ(h->dtype, DType::F16);
  EXPECT_EQ(h->storage.nbytes, 4u);
}

TEST(LegacyFormat, TruncatedFilesAreRejected) {
  std::ifstream in(kLegacy, std::ios::binary);
  const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(content.size(), 100u);
  for (size_t cut : {content.size() - 1, content.size() - 40, size_t{200}, size_t{40}}) {
    test_support::TempFile f(content.substr(0, cut));
    EXPECT_THROW(TorchArchive::open(io::File::open_standalone(f.path())), FormatError) << cut;
  }
}

}  // namespace
}  // namespace ckptfs::torch
