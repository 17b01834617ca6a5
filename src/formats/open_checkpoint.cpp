// Framework detection: the one place that knows every adapter.
#include <fmt/format.h>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/dcp.hpp"
#include "ckptfs/deepspeed.hpp"
#include "ckptfs/error.hpp"
#include "ckptfs/megatron.hpp"
#include "ckptfs/plain.hpp"
#include "ckptfs/verl.hpp"
#include "formats/dcp/hf_storage.hpp"

namespace ckptfs {

namespace fs = std::filesystem;

const CatalogPtr& Tag::catalog(std::string_view role) const {
  auto it = catalogs.find(role);
  if (it == catalogs.end()) throw std::out_of_range(fmt::format("tag {} has no {} catalog", name, role));
  return it->second;
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

// `source` with symlinks, `.`, `..` and trailing slashes resolved: adapters take tag names from the last
// path component, so "ckpt/", "./ckpt" and a link to ckpt must all read as ckpt.
fs::path resolved(const fs::path& source) {
  std::error_code ec;
  fs::path p = fs::canonical(source, ec);
  if (ec) throw SourceError(fmt::format("{}: {}", source.string(), ec == std::errc::no_such_file_or_directory
                                                                       ? "no such file or directory"
                                                                       : ec.message()));
  return p;
}

Checkpoint open_resolved(const fs::path& source, const OpenOptions& options) {
  std::error_code ec;
  if (plain::is_plain_source(source)) return plain::open(source, options);
  if (!fs::is_directory(source, ec))
    throw SourceError(fmt::format("{}: neither a directory nor a regular file", source.string()));
  if (deepspeed::is_deepspeed_source(source)) return deepspeed::open(source, options);
  // before Megatron: a verl save dir has a tracker of the same name
  if (verl::is_verl_source(source)) return verl::open(source, options);
  // before DCP: a torch_dist iteration dir is a DCP dir too
  if (megatron::is_megatron_source(source)) return megatron::open(source, options);
  if (dcp::is_dcp_source(source)) return dcp::open(source, options);
  if (dcp::is_hf_storage_dir(source)) return dcp::open_hf_storage(source, options);
  throw SourceError(fmt::format(
      "{}: no checkpoint found (expected a DeepSpeed save dir or tag dir, a Megatron-LM save dir or iteration dir, a verl save dir, a PyTorch DCP dir or a dir of safetensors files)", source.string()));
}

}  // namespace

Checkpoint open_checkpoint(const fs::path& source, const OpenOptions& options) {
  return open_resolved(resolved(source), options);
}

}  // namespace ckptfs
