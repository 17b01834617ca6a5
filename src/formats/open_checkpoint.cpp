// Framework detection: the one place that knows every adapter.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/dcp.hpp"
#include "ckptfs/deepspeed.hpp"
#include "ckptfs/error.hpp"
#include "ckptfs/fsdp.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/megatron.hpp"
#include "ckptfs/plain.hpp"
#include "ckptfs/verl.hpp"
#include "formats/dcp/hf_storage.hpp"
#include "formats/name_prefix.hpp"

namespace ckptfs {

namespace fs = std::filesystem;

std::string_view role_name(ViewRole role) {
  switch (role) {
    case ViewRole::model:
      return "model";
    case ViewRole::fp32:
      return "fp32";
    case ViewRole::hf:
      return "hf";
  }
  throw std::logic_error("unknown view role");
}

const CatalogPtr& Tag::catalog(ViewRole role, std::string_view folder) const {
  auto model = models.find(folder);
  if (model != models.end())
    if (auto it = model->second.find(role); it != model->second.end()) return it->second;
  throw std::out_of_range(fmt::format("tag {} has no {} catalog{}", name, role_name(role),
                                      folder.empty() ? "" : fmt::format(" in {}/", folder)));
}

bool Tag::has(ViewRole role, std::string_view folder) const {
  auto model = models.find(folder);
  return model != models.end() && model->second.contains(role);
}

void Tag::add(ViewRole role, CatalogPtr catalog, const std::string& folder) {
  models[folder].emplace(role, std::move(catalog));
}

std::vector<std::pair<std::string, CatalogPtr>> Tag::named_catalogs() const {
  std::vector<std::pair<std::string, CatalogPtr>> out;
  for (const auto& [folder, roles] : models)
    for (const auto& [role, c] : roles)
      out.emplace_back(
          folder.empty() ? std::string(role_name(role)) : fmt::format("{}:{}", folder, role_name(role)), c);
  for (const auto& [state, c] : states) out.emplace_back(state, c);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

const Tag* Checkpoint::find(const std::string& tag) const {
  for (const auto& t : tags)
    if (t.name == tag) return &t;
  return nullptr;
}

const Tag& Checkpoint::latest_tag() const {
  const Tag* t = find(latest);
  return t != nullptr ? *t : tags.back();
}

namespace {

// `root` with symlinks, `.`, `..` and trailing slashes resolved: adapters take tag names from the last
// path component, so "ckpt/", "./ckpt" and a link to ckpt must all read as ckpt.
fs::path resolved(const io::Source& source, const fs::path& root) {
  std::error_code ec;
  fs::path p = source.canonical(root, ec);
  if (ec)
    throw SourceError(
        fmt::format("{}: {}", root.string(),
                    ec == std::errc::no_such_file_or_directory ? "no such file or directory" : ec.message()));
  return p;
}

Checkpoint open_resolved(const io::Source& source, const fs::path& root, const OpenOptions& options) {
  if (plain::is_plain_source(source, root)) return plain::open(source, root, options);
  if (!source.is_directory(root))
    throw SourceError(fmt::format("{}: neither a directory nor a regular file", root.string()));
  if (deepspeed::is_deepspeed_source(source, root)) return deepspeed::open(source, root, options);
  // before Megatron: a verl save dir has a tracker of the same name
  if (verl::is_verl_source(source, root)) return verl::open(source, root, options);
  // before DCP: a torch_dist iteration dir is a DCP dir too
  if (megatron::is_megatron_source(source, root)) return megatron::open(source, root, options);
  // before DCP: accelerate writes its optimizer as a DCP dir beside the rank files
  if (fsdp::is_fsdp_source(source, root)) return fsdp::open(source, root, options);
  if (dcp::is_dcp_source(source, root)) return dcp::open(source, root, options);
  if (dcp::is_hf_storage_dir(source, root)) return dcp::open_hf_storage(source, root, options);
  throw SourceError(
      fmt::format("{}: no checkpoint found (expected a DeepSpeed save dir or tag dir, a Megatron-LM save dir "
                  "or iteration dir, a verl save dir, a folder of FSDP per-rank files, a PyTorch DCP dir or "
                  "a dir of safetensors files)",
                  root.string()));
}

// -o config=FILE is served as config.json beside each tag's views that have none, where from_pretrained
// looks for it.
void serve_model_config(Checkpoint& checkpoint, const OpenOptions& options) {
  if (!options.model_config) return;
  const auto is_config = [](const fs::path& f) { return f.filename() == "config.json"; };
  if (std::any_of(checkpoint.side_files.begin(), checkpoint.side_files.end(), is_config)) return;
  for (auto& tag : checkpoint.tags)
    if (std::none_of(tag.side_files.begin(), tag.side_files.end(), is_config) &&
        std::none_of(tag.extra_files.begin(), tag.extra_files.end(),
                     [](const ExtraFile& f) { return f.path == "config.json"; }))
      tag.extra_files.push_back({.path = "config.json", .bytes = PassedThrough{*options.model_config}});
}

}  // namespace

Checkpoint open_checkpoint(const io::Source& source, const OpenOptions& options) {
  Checkpoint checkpoint = open_resolved(source, resolved(source, source.root()), options);
  formats::strip_wrapper_prefixes(source, checkpoint, options);
  serve_model_config(checkpoint, options);
  return checkpoint;
}

}  // namespace ckptfs
