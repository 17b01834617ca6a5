// The files ckptfs shows for one tag, shared by `inspect`, `export` and the mount.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/sharding.hpp"
#include "ckptfs/views.hpp"

namespace ckptfs {

struct ViewFile {
  std::string path;  // relative: "model.safetensors", "fp32/pytorch_model.bin", ...
  views::VirtualFilePtr file;
};

// How the safetensors views are sharded (-o shard_size, export --shard-size; docs/mount.md).
struct ShardOptions {
  uint64_t max_shard_size = views::kDefaultShardSize;
  // Whether a sharded view also keeps its single file, as unsharded/model.safetensors in its folder (the
  // mount does; export writes what save_pretrained writes).
  bool unsharded_copy = true;
};

// The gguf/ view's choices (docs/formats/gguf.md).
struct GgufOptions {
  std::optional<std::string>
      pre;  // tokenizer.ggml.pre forced (-o gguf_pre=NAME); unset: found as the converter does
  std::string name = "hf";  // -o gguf_name=NAME: the HF directory's name the converter is given
  // Where GPT-2's Conv1D weights, which the converter writes transposed, keep their tiles: the command's
  // (OpenOptions::transpose_cache).
  std::shared_ptr<catalog::TransposeCache> transpose_cache = catalog::make_transpose_cache();
};

// model.safetensors (training dtype), fp32/pytorch_model.bin and fp32/model.safetensors (fp32 masters),
// and, where the tag has partitioned optimizer state and `with_universal` is set, the universal/ tree
// (docs/formats/universal.md; its files are built only when asked for: `export` skips them by default).
// A safetensors view larger than shards.max_shard_size is served as save_pretrained shards it. gguf/ holds
// what llama.cpp's converter makes of the model's Hugging Face directory (hf/, else the root model). The
// files it passes through are opened from `source`, the tag's.
std::vector<ViewFile> tag_views(const io::Source& source, const Tag& tag, bool with_universal = true,
                                const ShardOptions& shards = {}, const GgufOptions& gguf = {});

// Why the tag has no gguf/ (in the converter's terms, or what ckptfs does not follow yet; for inspect);
// nullopt where it has one, or where its model has no config.json.
std::optional<std::string> gguf_refusal(const io::Source& source, const Tag& tag,
                                        const ShardOptions& shards = {}, const GgufOptions& gguf = {});

// One row of a listing for people (`inspect`, ckptfs.json): a view file, or a tree of many files
// (universal/) counted as one.
struct ViewSummary {
  std::string path;  // "model.safetensors", "universal/"
  uint64_t bytes = 0;
  size_t files = 0;
  std::optional<uint64_t> source_bytes;  // the source bytes a whole read takes (each byte once), if asked for
};
// With `source_bytes`, also what each view reads from its sources (inspect; the mount's ckptfs.json does
// not spend the time).
std::vector<ViewSummary> summarize_views(const std::vector<ViewFile>& views, bool source_bytes = false);

namespace views {
// universal/latest_universal and universal/<tag>_universal/... of a tag with a UniversalPlan (else none).
std::vector<ViewFile> universal_views(const io::Source& source, const Tag& tag);
}  // namespace views

}  // namespace ckptfs
