#include "fuse/inode_table.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "vfs/test_files.hpp"

namespace ckptfs::fuse {
namespace {

using testing::memory_file;

struct Sources {
  testing::TempDir dir;
  io::FilePtr step1 = io::File::open(dir.write("step1.pt", "one"));
  io::FilePtr step2 = io::File::open(dir.write("step2.pt", "two"));
};

// The root holds the latest tag's view (one node with tags/<latest>/model.safetensors) and an info file.
std::shared_ptr<const vfs::VirtualTree> tree(const Sources& s, bool second_step) {
  vfs::TreeBuilder b;
  const io::FilePtr latest = second_step ? s.step2 : s.step1;
  const vfs::Ino root_view = b.add_file("model.safetensors", memory_file(second_step ? "222" : "111", {latest}));
  b.add_link(second_step ? "tags/step2/model.safetensors" : "tags/step1/model.safetensors", root_view);
  if (second_step) b.add_file("tags/step1/model.safetensors", memory_file("111", {s.step1}));
  b.add_file("ckptfs.json", memory_file(second_step ? "{\"root\": 2}" : "{\"root\": 1}"));
  return std::make_shared<const vfs::VirtualTree>(std::move(b).build());
}

KernelIno kernel_ino(InodeTable& table, std::string_view path) {
  const auto g = table.current();
  return g->kernel[vfs::lookup_path(*g->tree, path).node->ino];
}

TEST(InodeTable, UnchangedNodesKeepTheirInodesChangedOnesGetNewOnes) {
  Sources s;
  InodeTable table(tree(s, false));
  const KernelIno tags = kernel_ino(table, "tags");
  const KernelIno step1_view = kernel_ino(table, "tags/step1/model.safetensors");
  const KernelIno info = kernel_ino(table, "ckptfs.json");
  EXPECT_EQ(kernel_ino(table, "model.safetensors"), step1_view);

  const Invalidations changed = table.replace(tree(s, true));
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
  table.replace(tree(s, true));
  const Resolved held = table.find(info);
  ASSERT_NE(held.node, nullptr);
  EXPECT_EQ(held.generation, first);  // the old bytes, for a reader that has it open
  table.forget(info, 1);
  EXPECT_EQ(table.find(info).node, nullptr);

  const KernelIno never_looked_up = kernel_ino(table, "ckptfs.json");
  table.replace(tree(s, false));
  EXPECT_EQ(table.find(never_looked_up).node, nullptr);  // gone with its tree at once
}

}  // namespace
}  // namespace ckptfs::fuse
