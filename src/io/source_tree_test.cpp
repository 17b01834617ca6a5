// io::Source on local paths (the same answers std::filesystem gives the adapters) and on s3:// paths that
// a local source does not hold (refused, never taken for local ones). Remote trees are exercised against a
// real store by mount_tests/test_s3_mount.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "io/runtime.hpp"

namespace ckptfs::io {
namespace {

namespace fs = std::filesystem;

// A tree of the test's own (ctest runs the tests of this file at once).
// A local source of the test's own.
SourcePtr local_source(const fs::path& root) {
  return Runtime().open_local(root);
}

fs::path make_tree() {
  const fs::path root =
      fs::path(testing::TempDir()) /
      (std::string("io_tree_") + testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(root);
  fs::create_directories(root / "global_step1");
  std::ofstream(root / "latest") << "global_step1\n";
  std::ofstream(root / "global_step1" / "big.json") << std::string(5000, 'x');
  fs::create_directory_symlink(root / "global_step1", root / "linked");
  return root;
}

TEST(SourceTree, LocalPathsAnswerAsTheFileSystem) {
  const fs::path root = make_tree();
  const SourcePtr source = local_source(root);
  EXPECT_TRUE(source->is_directory(root));
  EXPECT_TRUE(source->is_directory(root / "linked"));  // followed, as fs::is_directory does
  EXPECT_TRUE(source->is_file(root / "latest"));
  EXPECT_FALSE(source->is_file(root / "global_step1"));
  EXPECT_TRUE(source->exists(root / "latest"));
  EXPECT_FALSE(source->exists(root / "missing"));
  EXPECT_FALSE(source->is_remote());
  std::set<std::pair<std::string, bool>> names;
  for (const auto& e : source->list_directory(root)) {
    EXPECT_EQ(e.path.parent_path(), root);
    EXPECT_NE(e.is_directory, e.is_file);
    names.emplace(e.path.filename().string(), e.is_directory);
  }
  EXPECT_EQ(names, (std::set<std::pair<std::string, bool>>{
                       {"latest", false}, {"global_step1", true}, {"linked", true}}));
  EXPECT_TRUE(source->list_directory(root / "latest").empty());
  EXPECT_TRUE(source->list_directory(root / "missing").empty());
}

TEST(SourceTree, SmallFilesAreReadWholeWithinTheirLimit) {
  const fs::path root = make_tree();
  const SourcePtr source = local_source(root);
  EXPECT_EQ(source->read_small_file(root / "latest", 100), "global_step1\n");
  EXPECT_EQ(source->read_small_file(root / "missing", 100), std::nullopt);
  EXPECT_EQ(source->read_small_file(root / "global_step1", 100), std::nullopt);
  try {
    source->read_small_file(root / "global_step1" / "big.json", 4096);
    FAIL() << "no error past the limit";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("big.json: larger than 4096 bytes"), std::string::npos) << e.what();
  }
}

TEST(SourceTree, PathStateSeesAChange) {
  const fs::path root = make_tree();
  const SourcePtr source = local_source(root);
  const auto before = source->path_state(root / "latest");
  ASSERT_TRUE(before);
  EXPECT_FALSE(before->directory);
  EXPECT_EQ(before->size, 13u);
  std::ofstream(root / "latest") << "global_step22\n";
  EXPECT_NE(source->path_state(root / "latest"), before);
  EXPECT_TRUE(source->path_state(root)->directory);
  EXPECT_EQ(source->path_state(root / "missing"), std::nullopt);
}

TEST(SourceTree, CanonicalResolvesLocalSpellingsAndKeepsRemoteOnes) {
  const fs::path root = make_tree();
  const SourcePtr source = local_source(root);
  std::error_code ec;
  EXPECT_EQ(source->canonical(root / "linked" / ".." / "latest", ec), fs::canonical(root / "latest"));
  EXPECT_FALSE(ec);
  source->canonical(root / "missing", ec);
  EXPECT_TRUE(ec);
  EXPECT_EQ(source->canonical("s3://bucket/ckpt", ec), fs::path("s3://bucket/ckpt"));
  EXPECT_FALSE(ec);
}

TEST(SourceTree, AnS3PathOfALocalSourceIsRefused) {
  const SourcePtr source = local_source(make_tree());
  const fs::path path = "s3://ckptfs-never-opened/ckpt/latest";
  EXPECT_THROW(source->is_file(path), SourceError);
  EXPECT_THROW(source->list_directory(path.parent_path()), SourceError);
}

}  // namespace
}  // namespace ckptfs::io
