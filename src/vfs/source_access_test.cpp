#include "vfs/source_access.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vfs/test_files.hpp"

namespace ckptfs::vfs {
namespace {

namespace fs = std::filesystem;

constexpr io::Access kUnlisted{4242, 4343, 0555};

// SRC/tag/rank{0,1}.pt, modes as each test sets them.
struct Sources {
  testing::TempDir dir;
  fs::path tag = dir.path() / "tag";
  io::FilePtr rank0, rank1;

  Sources() {
    fs::create_directory(tag);
    dir.write("tag/rank0.pt", "0");
    dir.write("tag/rank1.pt", "1");
    rank0 = io::File::open_standalone(tag / "rank0.pt");
    rank1 = io::File::open_standalone(tag / "rank1.pt");
  }
  // Modes set before the files are opened count: io::File records them at open.
  void reopen() {
    rank0 = io::File::open_standalone(tag / "rank0.pt");
    rank1 = io::File::open_standalone(tag / "rank1.pt");
  }
};

TEST(SourceAccess, AViewGetsTheReadBitsEverySourceGrants) {
  Sources s;
  ::chmod(s.dir.path().c_str(), 0755);
  ::chmod(s.tag.c_str(), 0755);
  ::chmod((s.tag / "rank0.pt").c_str(), 0644);
  ::chmod((s.tag / "rank1.pt").c_str(), 0640);
  s.reopen();
  SourceAccess access(s.dir.path(), false, kUnlisted);
  const auto view = access.file({s.rank0, s.rank1});
  ASSERT_TRUE(view);
  EXPECT_EQ(view->mode, 0440u);
  EXPECT_EQ(view->uid, ::geteuid());
  EXPECT_EQ(access.file({s.rank0})->mode, 0444u);
  EXPECT_FALSE(access.file({}));
}

TEST(SourceAccess, ADirectoryAClassCannotPassTakesItsReadBitsOnWhatIsBelow) {
  Sources s;
  ::chmod(s.dir.path().c_str(), 0755);
  ::chmod(s.tag.c_str(), 0750);  // others cannot reach the rank files
  ::chmod((s.tag / "rank0.pt").c_str(), 0644);
  s.reopen();
  SourceAccess access(s.dir.path(), false, kUnlisted);
  EXPECT_EQ(access.file({s.rank0})->mode, 0440u);
  EXPECT_EQ(access.directory(s.tag).mode, 0550u);
  EXPECT_EQ(access.directory(s.dir.path()).mode, 0555u);
}

TEST(SourceAccess, ADirectoryClosedToOthersClosesEverythingBelowIt) {
  Sources s;
  ::chmod(s.dir.path().c_str(), 0700);
  ::chmod(s.tag.c_str(), 0755);
  ::chmod((s.tag / "rank0.pt").c_str(), 0644);
  s.reopen();
  SourceAccess access(s.dir.path(), false, kUnlisted);
  EXPECT_EQ(access.directory(s.dir.path()).mode, 0500u);
  EXPECT_EQ(access.directory(s.tag).mode, 0500u);
  EXPECT_EQ(access.file({s.rank0})->mode, 0400u);
}

TEST(SourceAccess, ASymbolicLinkIsReachedThroughTheDirectoriesOfWhatItNames) {
  Sources s;
  testing::TempDir elsewhere;
  const fs::path hidden = elsewhere.path() / "private";
  fs::create_directory(hidden);
  std::ofstream(hidden / "rank2.pt") << "2";
  ::chmod((hidden / "rank2.pt").c_str(), 0644);
  ::chmod(hidden.c_str(), 0700);
  ::chmod(s.dir.path().c_str(), 0755);
  ::chmod(s.tag.c_str(), 0755);
  fs::create_symlink(hidden / "rank2.pt", s.tag / "rank2.pt");
  SourceAccess access(s.dir.path(), false, kUnlisted);
  EXPECT_EQ(access.file({io::File::open_standalone(s.tag / "rank2.pt")})->mode, 0400u);
}

TEST(SourceAccess, ADirectoryShowsSearchBitsWhereverItGrantsRead) {
  Sources s;
  ::chmod(s.dir.path().c_str(), 0755);
  ::chmod(s.tag.c_str(), 0741);  // r for the group without x; x for others without r
  SourceAccess access(s.dir.path(), false, kUnlisted);
  EXPECT_EQ(access.directory(s.tag).mode, 0550u);
}

TEST(SourceAccess, AnObjectHasTheUnlistedOwnerAndReadBits) {
  SourceAccess access("s3://bucket/run", true, kUnlisted);
  EXPECT_EQ(access.directory("s3://bucket/run"), kUnlisted);
}

}  // namespace
}  // namespace ckptfs::vfs
