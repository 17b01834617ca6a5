#include "torch/zip_index.hpp"

#include <gtest/gtest.h>

#include "ckptfs/error.hpp"
#include "torch/test_support.hpp"

namespace ckptfs::torch {
namespace {

using test_support::build_zip;
using test_support::TempFile;

std::string error_of(const std::string& zip) {
  TempFile f(zip);
  auto file = io::File::open_standalone(f.path());
  try {
    auto index = ZipIndex::read(file);
    for (const char* name : {"data.pkl", "data/0"})
      if (const ZipEntry* e = index.find(name)) index.locate(file, *e);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

TEST(ZipIndex, LocatesAlignedRecords) {
  for (bool z64 : {false, true}) {
    for (bool tail : {false, true}) {
      if (z64 && !tail) continue;  // saturated fields need the zip64 end record
      SCOPED_TRACE(testing::PrintToString(std::make_pair(z64, tail)));
      TempFile f(build_zip({{"data.pkl", "abc"}, {"data/0", std::string(100, 'x')}, {"version", "3\n"}},
                           {.root = "my_model", .zip64_tail = tail, .zip64_extras = z64}));
      auto file = io::File::open_standalone(f.path());
      auto index = ZipIndex::read(file);
      EXPECT_EQ(index.root(), "my_model");
      const ZipEntry* e = index.find("data/0");
      ASSERT_NE(e, nullptr);
      auto span = index.locate(file, *e);
      EXPECT_EQ(span.offset % 64, 0u);
      EXPECT_EQ(span.size, 100u);
      auto pkl = index.read(file, *index.find("data.pkl"));
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(pkl.data()), pkl.size()), "abc");
      EXPECT_EQ(index.find("missing"), nullptr);
    }
  }
}

TEST(ZipIndex, RootMustBeAFolder) {
  EXPECT_NE(error_of(build_zip({{"data.pkl", "abc"}}, {.root = ""})).find("not inside a top folder"),
            std::string::npos);
}

TEST(ZipIndex, Truncated) {
  const auto zip = build_zip({{"data.pkl", "abc"}, {"data/0", std::string(100, 'x')}});
  EXPECT_NE(error_of(zip.substr(0, zip.size() - 30)).find("end of central directory"), std::string::npos);
  EXPECT_NE(error_of(zip.substr(0, 10)).find("end of central directory"), std::string::npos);
  EXPECT_NE(error_of("not a zip at all, just some text that is long enough").find("not a zip"),
            std::string::npos);
}

TEST(ZipIndex, CentralDirectoryOutOfRange) {
  auto zip = build_zip({{"data.pkl", "abc"}}, {.zip64_tail = false});
  // Classic end record: central directory offset at 16 bytes into the last 22.
  zip[zip.size() - 22 + 16] = '\x7f';
  EXPECT_NE(error_of(zip).find("central directory"), std::string::npos) << error_of(zip);
}

TEST(ZipIndex, BadLocalOffset) {
  auto zip = build_zip({{"data.pkl", "abc"}, {"data/0", "0123456789"}});
  // Point data/0's central entry at data.pkl's local header.
  const size_t central = zip.find("PK\x01\x02", 0);
  const size_t second = zip.find("PK\x01\x02", central + 4);
  std::string bad = zip;
  bad[second + 42] = 0;
  EXPECT_NE(error_of(bad).find("names another record"), std::string::npos) << error_of(bad);
  bad = zip;
  bad[second + 42] = 5;  // not a local header
  EXPECT_NE(error_of(bad).find("no local header"), std::string::npos) << error_of(bad);
  bad = zip;
  bad[second + 45] = 0x70;  // far past the records
  EXPECT_NE(error_of(bad).find("outside the records"), std::string::npos) << error_of(bad);
}

TEST(ZipIndex, CompressedRecord) {
  const auto zip = build_zip({{"data.pkl", "abc"}, {"data/0", "xx", 8}});
  EXPECT_NE(error_of(zip).find("record 'archive/data/0' is compressed (method 8)"), std::string::npos)
      << error_of(zip);
}

TEST(ZipIndex, DataPastTheRecords) {
  auto zip = build_zip({{"data.pkl", "abc"}});
  const size_t central = zip.find("PK\x01\x02");
  zip[central + 24] = '\x50';  // size 80 runs into the central directory
  zip[central + 20] = '\x50';
  EXPECT_NE(error_of(zip).find("run past the records"), std::string::npos) << error_of(zip);
}

// Every record of real torch.save files (the bundled examples, written by Debian's torch) sits where
// torch_placement says torch's writer puts it, and its header bytes hold what the placement expects.
TEST(ZipIndex, TorchPlacementIsWhereTorchSaveWroteEachRecord) {
  const std::filesystem::path dir =
      std::filesystem::path(CKPTFS_SOURCE_DIR) / "examples/deepspeed-zero3-bf16/global_step3";
  size_t placed = 0;
  for (const auto& rank_file : std::filesystem::directory_iterator(dir)) {
    SCOPED_TRACE(rank_file.path().string());
    auto file = io::File::open_standalone(rank_file.path());
    const ZipIndex index = ZipIndex::read(file);
    for (const std::string name : {"data.pkl", "version"}) {
      const ZipEntry* e = index.find(name);
      ASSERT_NE(e, nullptr);
      const auto placement = index.torch_placement(file, *e);
      ASSERT_TRUE(placement.has_value());
      EXPECT_EQ(placement->span.offset, index.locate(file, *e).offset);
      file->expect(placement->header);  // a local file checks at once: throws if they differ
    }
    for (int key = 0; const ZipEntry* e = index.find("data/" + std::to_string(key)); ++key, ++placed) {
      const auto placement = index.torch_placement(file, *e);
      ASSERT_TRUE(placement.has_value());
      EXPECT_EQ(placement->span.offset, index.locate(file, *e).offset);
      EXPECT_EQ(placement->span.size, e->size);
      file->expect(placement->header);
    }
  }
  EXPECT_GT(placed, 3u);
}

TEST(ZipIndex, ARecordNotWhereTorchPutsItFailsItsExpectation) {
  // Zip64 extra fields on a small record (torch's writer gives them only to records of 4 GiB and up): the
  // data sits 28 bytes further than the placement says, and the header bytes say so.
  TempFile f(build_zip({{"data.pkl", "abc"}, {"data/0", std::string(100, 'x')}},
                       {.root = "m", .zip64_tail = true, .zip64_extras = true}));
  auto file = io::File::open_standalone(f.path());
  const ZipIndex index = ZipIndex::read(file);
  const ZipEntry* e = index.find("data/0");
  const auto placement = index.torch_placement(file, *e);
  ASSERT_TRUE(placement.has_value());
  EXPECT_NE(placement->span.offset, index.locate(file, *e).offset);
  EXPECT_THROW(file->expect(placement->header), SourceError);
}

}  // namespace
}  // namespace ckptfs::torch
