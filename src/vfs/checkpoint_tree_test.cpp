#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ckptfs/vfs.hpp"
#include "io/test_source.hpp"
#include "vfs/test_files.hpp"

namespace ckptfs::vfs {
namespace {

std::string read(const Node& node) {
  std::string out(node.size(), '\0');
  node.file->read(0, std::as_writable_bytes(std::span(out)));
  return out;
}

const Node& at(const VirtualTree& tree, std::string_view path) {
  Ino ino = kRootIno;
  for (size_t begin = 0; begin <= path.size();) {
    const size_t end = std::min(path.find('/', begin), path.size());
    const Node* n = tree.lookup(ino, path.substr(begin, end - begin));
    if (n == nullptr) throw std::runtime_error("missing: " + std::string(path));
    ino = n->ino;
    begin = end + 1;
  }
  return *tree.node(ino);
}

// Two tags of one float tensor each, read from a fake shard, plus side files; one side file is called
// model.safetensors and must move to source/.
struct Fixture {
  testing::TempDir dir;
  io::SourcePtr source = io::test_source(dir.path());
  Checkpoint checkpoint;

  Fixture() {
    const float values[4] = {1.f, 2.f, 3.f, 4.f};
    const auto shard = io::File::open_standalone(
        dir.write("shard.pt", std::string(reinterpret_cast<const char*>(values), 16)));
    for (const char* name : {"step1", "step2"}) {
      auto catalog = std::make_shared<catalog::Catalog>();
      catalog->tensors.push_back({"w",
                                  DType::F32,
                                  {2},
                                  catalog::FlatRuns{{{0, 2, shard, name[4] == '1' ? 0u : 8u, DType::F32}}},
                                  ""});
      Tag tag;
      tag.name = name;
      tag.dir = dir.path() / name;
      tag.models[""] = {{ViewRole::fp32, catalog}, {ViewRole::model, catalog}};
      checkpoint.tags.push_back(std::move(tag));
    }
    checkpoint.framework = "deepspeed";
    checkpoint.root = dir.path();
    checkpoint.latest = "step1";
    checkpoint.side_files = {dir.write("config.json", "{\"a\": 1}"), dir.write("model.safetensors", "side")};
  }
};

TEST(VfsCheckpointTree, LatestTagAtTheRootAndEveryTagUnderTags) {
  Fixture f;
  const VirtualTree tree = build_tree(*f.source, f.checkpoint);
  for (const char* view : {"model.safetensors", "fp32/pytorch_model.bin", "fp32/model.safetensors"}) {
    EXPECT_EQ(read(at(tree, view)), read(at(tree, std::string("tags/step1/") + view))) << view;
    EXPECT_NE(read(at(tree, view)), read(at(tree, std::string("tags/step2/") + view))) << view;
    ASSERT_EQ(at(tree, view).sources.size(), 1u);
    EXPECT_EQ(at(tree, view).sources[0]->path(), f.dir.path() / "shard.pt");
  }
  const std::string st = read(at(tree, "model.safetensors"));
  EXPECT_NE(st.find("\"w\""), std::string::npos);
}

// Optimizer states are kept apart from the view roles: a state named "model" leaves the model view alone.
TEST(VfsCheckpointTree, AStateNamedModelLeavesTheModelView) {
  Fixture f;
  const std::string model = read(at(build_tree(*f.source, f.checkpoint), "model.safetensors"));
  f.checkpoint.tags[0].states["model"] = f.checkpoint.tags[1].catalog(ViewRole::model);
  EXPECT_NE(read(at(build_tree(*f.source, f.checkpoint), "tags/step2/model.safetensors")), model);
  EXPECT_EQ(read(at(build_tree(*f.source, f.checkpoint), "model.safetensors")), model);
}

TEST(VfsCheckpointTree, SideFilesPassThroughAndYieldToViews) {
  Fixture f;
  const VirtualTree tree = build_tree(*f.source, f.checkpoint);
  EXPECT_EQ(read(at(tree, "config.json")), "{\"a\": 1}");
  EXPECT_EQ(read(at(tree, "source/model.safetensors")), "side");
  EXPECT_EQ(at(tree, "source/model.safetensors").sources.at(0)->path(), f.dir.path() / "model.safetensors");
  EXPECT_EQ(tree.lookup(kRootIno, "shard.pt"), nullptr);
  std::vector<std::string> root;
  for (const auto& [name, ino] : tree.node(kRootIno)->children) root.push_back(name);
  EXPECT_EQ(root, (std::vector<std::string>{"ckptfs.json", "config.json", "fp32", "model.safetensors",
                                            "source", "tags"}));
}

// A tag dir's own side files (a DCP or Hugging Face storage dir given as SRC) yield to the views the same
// way, at the root and under tags/<tag>/ (a regular file called ckptfs.json or fp32 too).
TEST(VfsCheckpointTree, TagSideFilesYieldToViews) {
  Fixture f;
  f.checkpoint.side_files.clear();
  f.checkpoint.tags[0].side_files = {f.dir.write("model.safetensors", "side"), f.dir.write("fp32", "a file"),
                                     f.dir.write("ckptfs.json", "{}"),
                                     f.dir.write("config.json", "{\"a\": 1}")};
  const VirtualTree tree = build_tree(*f.source, f.checkpoint);
  for (const std::string dir : {"", "tags/step1/"}) {
    EXPECT_EQ(read(at(tree, dir + "source/model.safetensors")), "side") << dir;
    EXPECT_EQ(read(at(tree, dir + "source/fp32")), "a file") << dir;
    EXPECT_EQ(read(at(tree, dir + "source/ckptfs.json")), "{}") << dir;
    EXPECT_EQ(read(at(tree, dir + "config.json")), "{\"a\": 1}") << dir;
    EXPECT_NE(read(at(tree, dir + "model.safetensors")), "side") << dir;
  }
  const auto info = nlohmann::json::parse(read(at(tree, "ckptfs.json")));
  EXPECT_EQ(info["renamed_side_files"], nlohmann::json({{"model.safetensors", "source/model.safetensors"},
                                                        {"fp32", "source/fp32"},
                                                        {"ckptfs.json", "source/ckptfs.json"}}));
}

TEST(VfsCheckpointTree, InfoFileDescribesTheMount) {
  Fixture f;
  const VirtualTree tree = build_tree(*f.source, f.checkpoint);
  const auto info = nlohmann::json::parse(read(at(tree, "ckptfs.json")));
  EXPECT_EQ(info["root_tag"], "step1");
  EXPECT_EQ(info["framework"], "deepspeed");
  EXPECT_EQ(info["tags"].size(), 2u);
  EXPECT_EQ(info["renamed_side_files"]["model.safetensors"], "source/model.safetensors");
  EXPECT_EQ(info["tags"][0]["views"][0]["size"], at(tree, "tags/step1/model.safetensors").size());
}

TEST(VfsCheckpointTree, SameCheckpointSameInodes) {
  Fixture f;
  const VirtualTree a = build_tree(*f.source, f.checkpoint), b = build_tree(*f.source, f.checkpoint);
  ASSERT_EQ(a.node_count(), b.node_count());
  for (Ino ino = kRootIno; ino <= a.node_count(); ++ino) EXPECT_EQ(a.path(ino), b.path(ino));
}

}  // namespace
}  // namespace ckptfs::vfs
