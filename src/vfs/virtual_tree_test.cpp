#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

#include "ckptfs/vfs.hpp"
#include "vfs/test_files.hpp"

namespace ckptfs::vfs {
namespace {

using testing::memory_file;

VirtualTree sample_tree() {
  TreeBuilder b;
  b.add_file("model.safetensors", memory_file("abc"));
  b.add_file("fp32/pytorch_model.bin", memory_file(std::string(1000, 'x')));
  b.add_file("fp32/model.safetensors", memory_file(""));
  b.add_file("tags/step2/fp32/model.safetensors", memory_file("z"));
  b.add_file("config.json", memory_file("{}"));
  return std::move(b).build();
}

TEST(VfsTree, NodesWithoutAccessOfTheirOwnTakeTheirDirectorysReadBits) {
  TreeBuilder b({1, 2, 0555});
  b.set_directory_access("tags/step2", {3, 4, 0550});
  b.add_file("tags/step2/fp32/model.safetensors", memory_file("z"));
  b.add_file("tags/step2/config.json", memory_file("{}"), io::Access{5, 6, 0400});
  b.add_file("ckptfs.json", memory_file("{}"));
  const VirtualTree tree = std::move(b).build();
  const auto access = [&](std::string_view path) { return lookup_path(tree, path).node->access; };
  EXPECT_EQ(access(""), (io::Access{1, 2, 0555}));
  EXPECT_EQ(access("tags"), (io::Access{1, 2, 0555}));
  EXPECT_EQ(access("tags/step2"), (io::Access{3, 4, 0550}));
  EXPECT_EQ(access("tags/step2/fp32"), (io::Access{3, 4, 0550}));
  EXPECT_EQ(access("tags/step2/fp32/model.safetensors"), (io::Access{3, 4, 0440}));
  EXPECT_EQ(access("tags/step2/config.json"), (io::Access{5, 6, 0400}));
  EXPECT_EQ(access("ckptfs.json"), (io::Access{1, 2, 0444}));
}

TEST(VfsTree, LookupWalksDirectories) {
  const VirtualTree tree = sample_tree();
  const Node* root = tree.node(kRootIno);
  ASSERT_NE(root, nullptr);
  EXPECT_TRUE(root->is_dir);
  const Node* fp32 = tree.lookup(kRootIno, "fp32");
  ASSERT_NE(fp32, nullptr);
  EXPECT_TRUE(fp32->is_dir);
  EXPECT_EQ(fp32->parent, kRootIno);
  const Node* bin = tree.lookup(fp32->ino, "pytorch_model.bin");
  ASSERT_NE(bin, nullptr);
  EXPECT_FALSE(bin->is_dir);
  EXPECT_EQ(bin->size(), 1000u);
  EXPECT_EQ(tree.path(bin->ino), "fp32/pytorch_model.bin");
  EXPECT_EQ(tree.path(kRootIno), "");
  EXPECT_EQ(tree.lookup(kRootIno, "missing"), nullptr);
  EXPECT_EQ(tree.lookup(bin->ino, "x"), nullptr);  // a file has no children
  EXPECT_EQ(tree.node(0), nullptr);
  EXPECT_EQ(tree.node(tree.node_count() + 1), nullptr);
}

TEST(VfsTree, ChildrenAreSortedAndCounted) {
  const VirtualTree tree = sample_tree();
  const Node* root = tree.node(kRootIno);
  std::vector<std::string> names;
  for (const auto& [name, ino] : root->children) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "fp32", "model.safetensors", "tags"}));
  EXPECT_EQ(root->subdirs, 2u);
  EXPECT_EQ(tree.node_count(), 10u);  // root, 5 files, fp32, tags, step2, step2/fp32
  EXPECT_EQ(tree.total_bytes(), 3u + 1000u + 0u + 1u + 2u);
}

TEST(VfsTree, InodesDependOnlyOnInsertionOrder) {
  const VirtualTree a = sample_tree(), b = sample_tree();
  ASSERT_EQ(a.node_count(), b.node_count());
  for (Ino ino = kRootIno; ino <= a.node_count(); ++ino) EXPECT_EQ(a.path(ino), b.path(ino));
}

TEST(VfsTree, RejectsBadPathsAndDuplicates) {
  TreeBuilder b;
  b.add_file("a/b", memory_file("1"));
  EXPECT_THROW(b.add_file("a/b", memory_file("2")), std::invalid_argument);
  EXPECT_THROW(b.add_file("a", memory_file("2")), std::invalid_argument);
  EXPECT_THROW(b.add_file("a/b/c", memory_file("2")), std::invalid_argument);
  for (const char* bad : {"", "/x", "x/", "x//y", "./x", "x/../y"})
    EXPECT_THROW(b.add_file(bad, memory_file("2")), std::invalid_argument) << bad;
}

TEST(VfsTree, MtimeComesFromTheSources) {
  testing::TempDir dir;
  const auto old_path = dir.write("old.pt", "old"), new_path = dir.write("new.pt", "new");
  std::filesystem::last_write_time(old_path,
                                   std::filesystem::file_time_type::clock::now() - std::chrono::hours(48));
  const auto old_file = io::File::open_standalone(old_path), new_file = io::File::open_standalone(new_path);
  ASSERT_LT(old_file->mtime_ns(), new_file->mtime_ns());

  TreeBuilder b;
  b.add_file("old", memory_file("1", {old_file}));
  b.add_file("both", memory_file("1", {old_file, new_file}));
  b.add_file("d/generated", memory_file("1"));
  const VirtualTree tree = std::move(b).build();
  EXPECT_EQ(tree.lookup(kRootIno, "old")->mtime_ns, old_file->mtime_ns());
  EXPECT_EQ(tree.lookup(kRootIno, "both")->mtime_ns, new_file->mtime_ns());
  const Node* d = tree.lookup(kRootIno, "d");
  EXPECT_EQ(d->mtime_ns, new_file->mtime_ns());
  EXPECT_EQ(tree.lookup(d->ino, "generated")->mtime_ns, new_file->mtime_ns());
  EXPECT_EQ(tree.node(kRootIno)->mtime_ns, new_file->mtime_ns());
}

}  // namespace
}  // namespace ckptfs::vfs

namespace ckptfs::vfs {
namespace {

TEST(VfsTree, LinkIsASecondNameOfTheSameInode) {
  TreeBuilder b;
  const Ino file = b.add_file("fp32/model.safetensors", testing::memory_file("abc"));
  b.add_link("tags/step1/fp32/model.safetensors", file);
  EXPECT_THROW(b.add_link("tags/step1/fp32/model.safetensors", file), std::invalid_argument);
  EXPECT_THROW(b.add_link("dir-link", kRootIno), std::invalid_argument);
  const VirtualTree tree = std::move(b).build();
  const Node* tagged =
      tree.lookup(tree.lookup(tree.lookup(tree.lookup(kRootIno, "tags")->ino, "step1")->ino, "fp32")->ino,
                  "model.safetensors");
  ASSERT_NE(tagged, nullptr);
  EXPECT_EQ(tagged->ino, file);
  EXPECT_EQ(tagged->links, 2u);
  EXPECT_EQ(tree.node(file)->size(), 3u);
}

TEST(VfsTree, LargeDirectoryIsSortedOnce) {
  TreeBuilder b;
  for (int i = 9999; i >= 0; --i)
    b.add_file("zero/p" + std::to_string(i) + "/fp32.pt", testing::memory_file("x"));
  const VirtualTree tree = std::move(b).build();
  const Node* zero = tree.lookup(kRootIno, "zero");
  ASSERT_EQ(zero->children.size(), 10000u);
  EXPECT_TRUE(std::is_sorted(zero->children.begin(), zero->children.end()));
  EXPECT_NE(tree.lookup(zero->ino, "p1234"), nullptr);
}

TEST(VfsTree, LookupPathTakesPathsAsUsersSpellThem) {
  const VirtualTree tree = sample_tree();
  for (const char* path : {"fp32/model.safetensors", "/fp32/model.safetensors", "./fp32//model.safetensors",
                           "fp32/./model.safetensors", "fp32/model.safetensors/"}) {
    const PathLookup found = lookup_path(tree, path);
    ASSERT_NE(found.node, nullptr) << path;
    EXPECT_EQ(tree.path(found.node->ino), "fp32/model.safetensors") << path;
  }
  const PathLookup dir = lookup_path(tree, "tags/step2/");
  ASSERT_NE(dir.node, nullptr);
  EXPECT_TRUE(dir.node->is_dir);
  for (const char* root : {"", "/", "."}) {
    const PathLookup found = lookup_path(tree, root);
    ASSERT_NE(found.node, nullptr) << root;
    EXPECT_EQ(found.node->ino, kRootIno) << root;
  }
}

TEST(VfsTree, LookupPathSaysWhereAMissingNameWasLookedFor) {
  const VirtualTree tree = sample_tree();
  PathLookup missing = lookup_path(tree, "fp32/model.safetensor");
  EXPECT_EQ(missing.node, nullptr);
  ASSERT_NE(missing.deepest, nullptr);
  EXPECT_EQ(tree.path(missing.deepest->ino), "fp32");
  EXPECT_EQ(missing.missing, "model.safetensor");

  missing = lookup_path(tree, "tags/step3/model.safetensors");
  ASSERT_NE(missing.deepest, nullptr);
  EXPECT_EQ(tree.path(missing.deepest->ino), "tags");
  EXPECT_EQ(missing.missing, "step3");

  // ".." names nothing (the tree is not walked upwards), and a file has nothing below it
  EXPECT_EQ(lookup_path(tree, "fp32/../model.safetensors").node, nullptr);
  missing = lookup_path(tree, "model.safetensors/x");
  EXPECT_EQ(missing.node, nullptr);
  EXPECT_EQ(missing.deepest->ino, kRootIno);
  EXPECT_EQ(missing.missing, "model.safetensors");
}

TEST(VfsTree, ClosestNamesComeFirstWithDirectoriesMarked) {
  const VirtualTree tree = sample_tree();
  const Node* fp32 = lookup_path(tree, "fp32").node;
  ASSERT_NE(fp32, nullptr);
  EXPECT_EQ(closest_names(tree, *fp32, "pytorch_model.pt", 8),
            (std::vector<std::string>{"pytorch_model.bin", "model.safetensors"}));
  EXPECT_EQ(closest_names(tree, *fp32, "model.safetensor", 1),
            (std::vector<std::string>{"model.safetensors"}));
  const Node* root = tree.node(kRootIno);
  EXPECT_EQ(closest_names(tree, *root, "tag", 2), (std::vector<std::string>{"tags/", "fp32/"}));
  EXPECT_EQ(closest_names(tree, *root, "", 8),
            (std::vector<std::string>{"config.json", "fp32/", "model.safetensors", "tags/"}));
}

}  // namespace
}  // namespace ckptfs::vfs
