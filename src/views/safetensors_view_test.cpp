// The safetensors view parsed back: header JSON, offsets without holes, alignment, exact size, tensor bytes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ckptfs/error.hpp"
#include "ckptfs/views.hpp"
#include "views/test_catalog.hpp"

namespace ckptfs::views {
namespace {

using testing::le;
using testing::read_file;
using testing::TestCatalog;

TEST(Safetensors, LayoutIsWhatTheReferenceReaderAccepts) {
  const TestCatalog tc({{"embed.weight", DType::BF16, {7, 3}},
                        {"layer.0.bias", DType::F32, {5}},
                        {"step", DType::I64, {}},
                        {"mask", DType::Bool, {3}},
                        {"empty", DType::F32, {0, 4}},
                        {"a.weight", DType::BF16, {2, 2}},
                        {"z.scale", DType::F32, {1}},
                        {"q\"uote\\", DType::U8, {9}}});
  const auto file = make_safetensors(tc.catalog());
  const std::string all = read_file(*file, 0, file->size());
  const uint64_t n = le(all, 0, 8);
  ASSERT_EQ(n % 8, 0u);
  const std::string header = all.substr(8, n);
  EXPECT_EQ(
      header.rfind(
          R"({"__metadata__":{"format":"pt"},"step":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)", 0),
      0u);
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
  const auto json = nlohmann::ordered_json::parse(header);
  ASSERT_EQ(json["__metadata__"].dump(), R"({"format":"pt"})");

  // safetensors' writer order: its dtype enum descending (I64, F32, BF16, U8, BOOL here), then by name.
  std::vector<std::string> names;
  for (const auto& [name, value] : json.items())
    if (name != "__metadata__") names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"step", "empty", "layer.0.bias", "z.scale", "a.weight",
                                             "embed.weight", "q\"uote\\", "mask"}));
  uint64_t end = 0;
  for (const auto& name : names) {
    const auto& entry = json[name];
    size_t i = 0;
    while (tc.catalog()->tensors[i].name != name) ++i;
    const auto& t = tc.catalog()->tensors[i];
    EXPECT_EQ(entry["dtype"], dtype_safetensors_name(t.dtype));
    EXPECT_EQ(entry["shape"].get<std::vector<int64_t>>(), t.shape);
    const auto offsets = entry["data_offsets"].get<std::vector<uint64_t>>();
    EXPECT_EQ(offsets[0], end) << name;  // no holes, no overlaps
    EXPECT_EQ(offsets[1] - offsets[0], t.nbytes()) << name;
    EXPECT_EQ((8 + n + offsets[0]) % dtype_size(t.dtype), 0u) << name;  // naturally aligned in the file
    EXPECT_EQ(all.substr(8 + n + offsets[0], t.nbytes()), tc.bytes(i)) << name;
    end = offsets[1];
  }
  EXPECT_EQ(file->size(), 8 + n + end);
  EXPECT_EQ(file->sources().size(), 7u);  // every tensor but the empty one reads a file
}

TEST(Safetensors, EmptyCatalogAndDuplicateNames) {
  const auto empty = make_safetensors(std::make_shared<catalog::Catalog>());
  const std::string all = read_file(*empty, 0, empty->size());
  EXPECT_EQ(all.substr(8), R"({"__metadata__":{"format":"pt"}})");  // 32 bytes: no padding needed
  EXPECT_EQ(le(all, 0, 8), 32u);

  const TestCatalog dup({{"w", DType::F32, {2}}, {"v", DType::F16, {2}}, {"w", DType::BF16, {2}}});
  EXPECT_THROW(make_safetensors(dup.catalog()), FormatError);
}

}  // namespace
}  // namespace ckptfs::views
