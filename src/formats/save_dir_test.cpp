#include "formats/save_dir.hpp"

#include <gtest/gtest.h>

#include "io/test_source.hpp"

namespace ckptfs::formats {
namespace {

// A save dir of tags step1..step3 whose tracker names `tracked`; reading a tag records its name.
SaveDir<int> save_dir(const std::string& tracked) {
  SaveDir<int> dir("test", "/run", "no tag");
  for (int i = 1; i <= 3; ++i) dir.tags.emplace_back("step" + std::to_string(i), i);
  if (!tracked.empty()) dir.tracked = Tracked{"/run/latest", tracked};
  return dir;
}

Checkpoint open(SaveDir<int> dir, const OpenOptions& options, std::vector<std::string>& read) {
  return open_save_dir(*io::test_source("/run"), std::move(dir), options,
                       [&](io::FileSet&, const std::string& name, int) {
                         read.push_back(name);
                         Tag tag;
                         tag.name = name;
                         return tag;
                       });
}

std::vector<std::string> names(const Checkpoint& cp) {
  std::vector<std::string> out;
  for (const auto& t : cp.tags) out.push_back(t.name);
  return out;
}

TEST(SaveDir, ASnapshotServesEveryTag) {
  std::vector<std::string> read;
  const Checkpoint cp = open(save_dir("step2"), {}, read);
  EXPECT_EQ(names(cp), (std::vector<std::string>{"step1", "step2", "step3"}));
  EXPECT_EQ(cp.latest, "step2");
  EXPECT_TRUE(cp.in_progress.empty());
}

TEST(SaveDir, ATagAfterTheTrackersIsInProgress) {
  std::vector<std::string> read;
  const Checkpoint cp = open(save_dir("step2"), complete_saves_only({}), read);
  EXPECT_EQ(names(cp), (std::vector<std::string>{"step1", "step2"}));
  EXPECT_EQ(cp.in_progress, (std::vector<std::string>{"step3"}));
  EXPECT_EQ(read, (std::vector<std::string>{"step1", "step2"}));  // never read while being written
}

TEST(SaveDir, KnownTagsAreKeptAsReadAndTheAdaptersMarkCounts) {
  Tag kept;
  kept.name = "step1";
  kept.format = "read before";
  OpenOptions options;
  options.known = [&](const std::string& name) { return name == "step1" ? &kept : nullptr; };
  SaveDir<int> dir = save_dir("");
  dir.complete = [](const std::string&, int step) { return step != 3; };  // step3 lacks its mark
  std::vector<std::string> read;
  const Checkpoint cp = open(std::move(dir), options, read);
  EXPECT_EQ(read, (std::vector<std::string>{"step2"}));
  ASSERT_EQ(names(cp), (std::vector<std::string>{"step1", "step2"}));
  EXPECT_EQ(cp.tags[0].format, "read before");
  EXPECT_EQ(cp.latest, "step2");  // no tracker: the last complete tag
}

}  // namespace
}  // namespace ckptfs::formats
