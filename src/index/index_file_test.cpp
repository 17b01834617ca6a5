// The index container: an LZ4 frame with its checksums behind a header of what it was written for. Any
// damage is FormatError, any other writer (format, build, source or options) is StaleIndex; and through
// the cache, a damaged index is parsed again and an unwritable cache dir never fails anything.
#include "index/index_file.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "ckptfs/error.hpp"
#include "ckptfs/index.hpp"
#include "index/build_id.hpp"
#include "index/checkpoint_fields.hpp"
#include "io/test_source.hpp"

namespace ckptfs::index {
namespace {

namespace fs = std::filesystem;

const IndexKey kKey{"0123abcd", "ckptfs test\n/src\nall tags"};

std::string sample_body(size_t n) {
  std::mt19937 rng(7);
  std::string body(n, '\0');
  for (auto& c : body) c = static_cast<char>("abcdefgh"[rng() % 8]);
  return body;
}

TEST(IndexFile, RoundTripsBodiesOfManyBlocks) {
  for (const size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{9} << 20}) {
    const std::string body = sample_body(n);
    EXPECT_EQ(unpack_index(pack_index(kKey, body), kKey), body) << n;
  }
}

// In the header another key (StaleIndex), in the frame a failed checksum or a frame that no longer parses.
TEST(IndexFile, EveryFlippedByteIsFound) {
  const std::string file = pack_index(kKey, sample_body(5000));
  for (size_t at = 0; at < file.size(); ++at) {
    std::string damaged = file;
    damaged[at] = static_cast<char>(damaged[at] ^ 0x20);
    EXPECT_THROW(unpack_index(damaged, kKey), FormatError) << at;
  }
}

TEST(IndexFile, TruncatedOrExtendedIsDamaged) {
  const std::string file = pack_index(kKey, sample_body(3000));
  for (size_t n = 0; n < file.size(); ++n)
    EXPECT_THROW(unpack_index(file.substr(0, n), kKey), FormatError) << n;
  EXPECT_THROW(unpack_index(file + "x", kKey), FormatError);
}

TEST(IndexFile, AnotherWriterIsStale) {
  const std::string file = pack_index(kKey, "body");
  EXPECT_THROW(unpack_index(file, {"0123abce", kKey.key}), StaleIndex);
  EXPECT_THROW(unpack_index(file, {kKey.build_id, kKey.key + ", strict"}), StaleIndex);
}

TEST(IndexFile, TheBuildIdIsTheBinarysGnuNote) {
  const std::string& id = build_id();
  EXPECT_EQ(id.size(), 40u);  // sha1 (-Wl,--build-id=sha1)
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
}

class Cache : public testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(testing::TempDir()) / "index-cache-test";
    fs::remove_all(root_);
    fs::create_directories(root_);
    fs::copy(fs::path(CKPTFS_SOURCE_DIR) / "examples/deepspeed-zero3-bf16", root_ / "src",
             fs::copy_options::recursive);
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

TEST_F(Cache, ADamagedFrameIsParsedAgain) {
  const fs::path cache = root_ / "cache";
  const Opened first = open_indexed(io::test_source(root_ / "src"), {}, cache);
  ASSERT_FALSE(first.from_index);
  EXPECT_EQ(save_index(first), "");
  EXPECT_TRUE(open_indexed(io::test_source(root_ / "src"), {}, cache).from_index);
  {  // the content checksum, the frame's last 4 bytes
    std::fstream f(first.index_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x5a');
  }
  const Opened again = open_indexed(io::test_source(root_ / "src"), {}, cache);
  EXPECT_FALSE(again.from_index);
  EXPECT_NE(again.parsed_because.find("damaged"), std::string::npos) << again.parsed_because;
  EXPECT_EQ(again.checkpoint.tags.size(), first.checkpoint.tags.size());
}

TEST_F(Cache, AnUnwritableCacheDirIsAWarningOrExitSeven) {
  std::ofstream(root_ / "a-file") << "not a directory";
  const fs::path cache = root_ / "a-file" / "cache";
  const Opened opened = open_indexed(io::test_source(root_ / "src"), {}, cache);
  EXPECT_FALSE(opened.from_index);
  EXPECT_NE(save_index(opened).find("cannot write the index"), std::string::npos);
  try {
    write_index(*io::test_source(root_ / "src"), {}, cache);
    ADD_FAILURE() << "write_index wrote into a file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::output_failed) << e.what();
  }
}

}  // namespace
}  // namespace ckptfs::index
