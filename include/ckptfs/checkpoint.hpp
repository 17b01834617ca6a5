// A checkpoint directory as ckptfs understands it, whatever the framework: its tags (saved steps), and
// per tag the topology and two catalogs (fp32 master weights, model weights in the training dtype).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "ckptfs/dtype.hpp"

namespace ckptfs {

struct Topology {
  int dp = 1;  // data-parallel world size the optimizer state is partitioned over
  int tp = 1;
  int pp = 1;
  int zero_stage = 0;
  std::string optimizer;  // "DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer_Stage3", "BF16_Optimizer", ...
  DType train_dtype = DType::F32;
};

struct Tag {
  std::string name;
  std::filesystem::path dir;
  Topology topology;
  std::shared_ptr<const catalog::Catalog> fp32;   // fp32 master weights (zero_to_fp32 equivalent)
  std::shared_ptr<const catalog::Catalog> model;  // weights in the training dtype
  std::vector<std::filesystem::path> files;       // every checkpoint file of the tag
  std::vector<std::string> notes;                 // deviations from the reference tools, for `inspect`
};

struct Checkpoint {
  std::string framework;                          // "deepspeed"
  std::filesystem::path root;                     // the save dir (parent of the tags)
  std::string latest;                             // tag served at the mount root
  std::vector<Tag> tags;                          // sorted naturally (global_step9 before global_step10)
  std::vector<std::filesystem::path> side_files;  // regular files of the root that are not checkpoint data

  const Tag* find(const std::string& tag) const;
  const Tag& latest_tag() const;
};

struct OpenOptions {
  std::optional<std::string> tag;  // only open this tag (default: every tag)
};

// Detects the framework of `source` (a save dir or one tag dir) and indexes it. Throws SourceError when
// nothing readable is there, FormatError / UnsupportedError naming the file otherwise.
Checkpoint open_checkpoint(const std::filesystem::path& source, const OpenOptions& options = {});

}  // namespace ckptfs
