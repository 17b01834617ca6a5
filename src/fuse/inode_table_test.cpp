#include "fuse/inode_table.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "vfs/test_files.hpp"

namespace ckptfs::fuse {
namespace {

using testing::memory_file;

struct Sources {
  testing::TempDir dir;
  io::FilePtr step1 = io::File::open_standalone(dir.write("step1.pt", "one"));
  io::FilePtr step2 = io::File::open_standalone(dir.write("step2.pt", "two"));
};

// The root holds the latest tag's view (one node with tags/<latest>/model.safetensors) and an info file.
std::shared_ptr<const vfs::VirtualTree> tree(const Sources& s, bool second_step) {
  vfs::TreeBuilder b;
  const io::FilePtr latest = second_step ? s.step2 : s.step1;
  const vfs::Ino root_view =
      b.add_file("model.safetensors", memory_file(second_step ? "222" : "111", {latest}));
  b.add_link(second_step ? "tags/step2/model.safetensors" : "tags/step1/model.safetensors", root_view);
  if (second_step) b.add_file("tags/step1/model.safetensors", memory_file("111", {s.step1}));
  b.add_file("ckptfs.json", memory_file(second_step ? "{\"root\": 2}" : "{\"root\": 1}"));
  return std::make_shared<const vfs::VirtualTree>(std::move(b).build());
}

KernelIno kernel_ino(InodeTable& table, std::string_view path) {
  const auto g = table.current();
  return g->kernel[vfs::lookup_path(*g->tree, path).node->ino];
}

// The info file the current tree serves.
std::string current_info(const InodeTable& table) {
  const auto g = table.current();
  const vfs::Node& node = *vfs::lookup_path(*g->tree, "ckptfs.json").node;
  std::string bytes(node.size(), '\0');
  node.file->read(0, std::as_writable_bytes(std::span(bytes)));
  return bytes;
}

TEST(InodeTable, UnchangedNodesKeepTheirInodesChangedOnesGetNewOnes) {
  Sources s;
  InodeTable table(tree(s, false));
  const KernelIno tags = kernel_ino(table, "tags");
  const KernelIno step1_view = kernel_ino(table, "tags/step1/model.safetensors");
  const KernelIno info = kernel_ino(table, "ckptfs.json");
  EXPECT_EQ(kernel_ino(table, "model.safetensors"), step1_view);

  Invalidations changed;
  table.replace(tree(s, true), [&](const Invalidations& i) { changed = i; });
  EXPECT_EQ(kernel_ino(table, "tags"), tags);
  EXPECT_EQ(kernel_ino(table, "tags/step1/model.safetensors"), step1_view);  // its pages stay cached
  EXPECT_NE(kernel_ino(table, "model.safetensors"), step1_view);             // the root moved
  EXPECT_NE(kernel_ino(table, "ckptfs.json"), info);
  const auto has_entry = [&](KernelIno parent, std::string_view name) {
    return std::find(changed.entries.begin(), changed.entries.end(), std::pair(parent, std::string(name))) !=
           changed.entries.end();
  };
  EXPECT_TRUE(has_entry(vfs::kRootIno, "model.safetensors"));
  EXPECT_TRUE(has_entry(vfs::kRootIno, "ckptfs.json"));
  EXPECT_TRUE(has_entry(tags, "step2"));
  EXPECT_FALSE(has_entry(tags, "step1"));
  EXPECT_NE(std::find(changed.inodes.begin(), changed.inodes.end(), tags), changed.inodes.end());
  EXPECT_EQ(table.find(vfs::kRootIno).generation, table.current());
}

TEST(InodeTable, ANodeOfAReplacedTreeLivesUntilTheKernelForgetsIt) {
  Sources s;
  InodeTable table(tree(s, false));
  const auto first = table.current();
  const vfs::Ino local = vfs::lookup_path(*first->tree, "ckptfs.json").node->ino;
  const KernelIno info = table.looked_up(first, local);
  table.replace(tree(s, true), [](const Invalidations&) {});
  const Resolved held = table.find(info);
  ASSERT_NE(held.node, nullptr);
  EXPECT_EQ(held.generation, first);  // the old bytes, for a reader that has it open
  table.forget(info, 1);
  EXPECT_EQ(table.find(info).node, nullptr);

  const KernelIno never_looked_up = kernel_ino(table, "ckptfs.json");
  table.replace(tree(s, false), [](const Invalidations&) {});
  EXPECT_EQ(table.find(never_looked_up).node, nullptr);  // gone with its tree at once
}

// The kernel drops the names it cached from the old tree before the new tree (its ckptfs.json) can be seen,
// may not cache what it looks up in between, and drops them again after the swap.
TEST(InodeTable, TheKernelDropsTheOldNamesBeforeTheNewTreeIsSeenAndAgainAfter) {
  Sources s;
  InodeTable table(tree(s, false));
  const auto first = table.current();
  EXPECT_TRUE(table.cacheable(first));
  std::vector<std::pair<std::string, bool>> calls;  // per invalidation: the info served, whether cacheable
  table.replace(tree(s, true), [&](const Invalidations& changed) {
    EXPECT_FALSE(changed.entries.empty());
    calls.emplace_back(current_info(table), table.cacheable(table.current()));
  });
  const std::vector<std::pair<std::string, bool>> expected = {{"{\"root\": 1}", false},
                                                              {"{\"root\": 2}", true}};
  EXPECT_EQ(calls, expected);
  EXPECT_FALSE(table.cacheable(first));
}

}  // namespace
}  // namespace ckptfs::fuse
