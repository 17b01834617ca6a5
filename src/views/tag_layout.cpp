#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string_view>

#include "ckptfs/error.hpp"
#include "ckptfs/layout.hpp"
#include "ckptfs/overloaded.hpp"
#include "views/gguf/gguf_view.hpp"
#include "views/torch_value.hpp"

namespace ckptfs {

namespace {

constexpr std::string_view kUnshardedDir = "unsharded";  // a sharded view's single file

// A tag's side files beside its views; one whose name a view (or, at the mount root, ckptfs.json or tags/)
// takes is served as source/<name> instead, as the mount does with the root's side files (docs/mount.md).
void add_side_files(const io::Source& source, std::vector<ViewFile>& views,
                    const std::vector<std::filesystem::path>& side_files) {
  std::set<std::string, std::less<>> taken(views::kRootNames.begin(), views::kRootNames.end());
  for (const auto& v : views) taken.insert(v.path.substr(0, v.path.find('/')));
  const bool any_moved = std::any_of(side_files.begin(), side_files.end(),
                                     [&](const auto& f) { return taken.contains(f.filename().string()); });
  if (any_moved) taken.insert("source");
  for (const auto& file : side_files) {
    const std::string name = file.filename().string();
    views.push_back(
        {taken.contains(name) ? "source/" + name : name, views::make_passthrough(source.open(file))});
  }
}

// The safetensors view of `catalog` in folder `dir` ("" or "fp32/"): model.safetensors, or its shards and
// index with the single file kept under unsharded/. The shards follow the state_dict order of `model`
// (the same tensors in the training dtype; `catalog` itself for the model and hf/ views).
void add_safetensors(std::vector<ViewFile>& views, const std::string& dir,
                     const std::shared_ptr<const catalog::Catalog>& catalog, const catalog::Catalog& model,
                     const ShardOptions& shards) {
  auto files = views::make_sharded_safetensors(catalog, model, shards.max_shard_size);
  const bool sharded = files.size() > 1;
  for (auto& f : files) views.push_back({dir + f.name, std::move(f.file)});
  if (sharded && shards.unsharded_copy)
    views.push_back({fmt::format("{}{}/{}", dir, kUnshardedDir, views::kSafetensorsName),
                     views::make_safetensors(catalog)});
}

// The files of the model's Hugging Face directory that llama.cpp's converter reads (the others are only
// named, for its refusals): hf/'s where the tag has one, else the tag's side files.
views::gguf::HfDirectory hf_directory(const io::Source& source, const Tag& tag) {
  constexpr uint64_t kMaxRead = uint64_t{256} << 20;
  static const std::set<std::string, std::less<>> kRead = {"config.json", "generation_config.json",
                                                           "tokenizer.json", "tokenizer_config.json"};
  views::gguf::HfDirectory dir;
  const auto add = [&](const std::string& name, const std::function<std::string()>& bytes) {
    dir.files[name] = kRead.contains(name) ? bytes() : std::string();
  };
  const auto read = [&](const std::filesystem::path& path) {
    const auto file = views::make_passthrough(source.open(path));
    if (file->size() > kMaxRead)
      throw UnsupportedError(fmt::format("{}: over {} bytes", path.string(), kMaxRead));
    std::string bytes(file->size(), '\0');
    file->read(0, std::as_writable_bytes(std::span(bytes)));
    return bytes;
  };
  if (tag.has(ViewRole::hf)) {
    for (const auto& extra : tag.extra_files)
      if (extra.path.starts_with("hf/") && extra.path.find('/', 3) == std::string::npos)
        add(extra.path.substr(3), [&] {
          return std::visit(Overloaded{[](const WrittenText& w) { return w.text; },
                                       [&](const PassedThrough& p) { return read(p.source); }},
                            extra.bytes);
        });
  } else {
    for (const auto& file : tag.side_files) add(file.filename().string(), [&] { return read(file); });
  }
  return dir;
}

// gguf/ (docs/formats/gguf.md) beside the model's safetensors: hf/'s model where the tag has one (Megatron),
// else the root model's, in the safetensors files add_safetensors serves it in. Nothing where the model has
// no config.json.
std::optional<views::gguf::GgufViews> gguf_views(const io::Source& source, const Tag& tag,
                                                 const ShardOptions& shards, const GgufOptions& gguf) {
  const ViewRole role = tag.has(ViewRole::hf) ? ViewRole::hf : ViewRole::model;
  if (!tag.has(role)) return std::nullopt;
  const auto& catalog = tag.catalog(role);
  // gguf/ never costs the tag its other views: a side file that cannot be read is its refusal
  views::gguf::HfDirectory dir;
  try {
    dir = hf_directory(source, tag);
  } catch (const Error& e) {
    return views::gguf::GgufViews{{}, e.what()};
  }
  if (!dir.has("config.json")) return std::nullopt;
  // the converter takes the tensors shard file by shard file, as the safetensors view serves them
  const auto order = views::state_dict_order(*catalog, *catalog);
  return views::gguf::make_gguf_views(catalog, views::plan_shards(*catalog, order, shards.max_shard_size),
                                      dir, {gguf.pre, gguf.name, gguf.transpose_cache});
}

void add_gguf(const io::Source& source, std::vector<ViewFile>& views, const Tag& tag,
              const ShardOptions& shards, const GgufOptions& gguf) {
  if (auto g = gguf_views(source, tag, shards, gguf))
    for (auto& f : g->files) views.push_back({"gguf/" + f.name, std::move(f.file)});
}

}  // namespace

std::vector<ViewFile> tag_views(const io::Source& source, const Tag& tag, bool with_universal,
                                const ShardOptions& shards, const GgufOptions& gguf) {
  // The view builders know the tensors, not where they come from: their errors (a name that appears
  // twice, a header over the size limit) get the tag directory.
  try {
    std::vector<ViewFile> views;
    // the root model, then a further model (verl's critic) in its folder, then the hf/ views
    const auto dir_of = [](const std::string& folder) { return folder.empty() ? folder : folder + "/"; };
    for (const auto& [folder, roles] : tag.models) {
      const std::string dir = dir_of(folder);
      const auto& model = tag.catalog(ViewRole::model, folder);
      add_safetensors(views, dir, model, *model, shards);
      if (tag.has(ViewRole::fp32, folder)) {
        views.push_back({dir + "fp32/pytorch_model.bin",
                         views::make_torch_save(tag.catalog(ViewRole::fp32, folder), "pytorch_model")});
        add_safetensors(views, dir + "fp32/", tag.catalog(ViewRole::fp32, folder), *model, shards);
      }
    }
    for (const auto& [folder, roles] : tag.models)
      if (tag.has(ViewRole::hf, folder))
        add_safetensors(views, dir_of(folder) + "hf/", tag.catalog(ViewRole::hf, folder),
                        *tag.catalog(ViewRole::hf, folder), shards);
    add_gguf(source, views, tag, shards, gguf);
    for (const auto& extra : tag.extra_files)
      views.push_back(
          {extra.path, std::visit(Overloaded{[](const WrittenText& w) -> views::VirtualFilePtr {
                                               return views::make_bytes_file(w.text);
                                             },
                                             [&](const PassedThrough& p) -> views::VirtualFilePtr {
                                               return views::make_passthrough(source.open(p.source));
                                             }},
                                  extra.bytes)});
    for (const auto& state : tag.state_files) {
      // torch.save names the zip's top folder after the file: full_state.pt -> full_state/
      const std::string stem = std::filesystem::path(state.path).stem().string();
      views.push_back({state.path, views::make_torch_save_value(*state.value, stem)});
    }
    if (with_universal)
      for (auto& v : views::universal_views(source, tag)) views.push_back(std::move(v));
    add_side_files(source, views, tag.side_files);
    return views;
  } catch (const UnsupportedError& e) {
    throw UnsupportedError(fmt::format("{}: {}", tag.dir.string(), e.what()));
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("{}: {}", tag.dir.string(), e.what()));
  }
}

std::optional<std::string> gguf_refusal(const io::Source& source, const Tag& tag, const ShardOptions& shards,
                                        const GgufOptions& gguf) {
  try {
    const auto g = gguf_views(source, tag, shards, gguf);
    return g && g->files.empty() ? std::optional(g->refusal) : std::nullopt;
  } catch (const Error& e) {
    return e.what();
  }
}

std::vector<ViewSummary> summarize_views(const std::vector<ViewFile>& views, bool source_bytes) {
  std::vector<ViewSummary> out;
  std::vector<std::vector<catalog::Piece>> runs;  // per row, with source_bytes
  std::map<std::string, size_t> trees;            // "universal/" -> its row
  for (const auto& v : views) {
    size_t row = out.size();
    if (v.path.starts_with("universal/")) {
      auto [it, inserted] = trees.try_emplace("universal/", out.size());
      if (inserted) out.push_back({"universal/", 0, 0, std::nullopt});
      row = it->second;
    } else {
      out.push_back({v.path, 0, 0, std::nullopt});
    }
    out[row].bytes += v.file->size();
    out[row].files += 1;
    if (source_bytes) {
      runs.resize(out.size());
      v.file->append_source_runs(runs[row]);
    }
  }
  if (source_bytes)
    for (size_t row = 0; row < out.size(); ++row)
      out[row].source_bytes = row < runs.size() ? views::distinct_source_bytes(std::move(runs[row])) : 0;
  return out;
}

}  // namespace ckptfs
