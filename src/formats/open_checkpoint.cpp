// Framework detection: the one place that knows every adapter.
#include <fmt/format.h>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/dcp.hpp"
#include "ckptfs/deepspeed.hpp"
#include "ckptfs/error.hpp"
#include "ckptfs/megatron.hpp"
#include "ckptfs/plain.hpp"
#include "ckptfs/verl.hpp"

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

Checkpoint open_checkpoint(const fs::path& source, const OpenOptions& options) {
  std::error_code ec;
  if (!fs::exists(source, ec))
    throw SourceError(fmt::format("{}: no such file or directory", source.string()));
  if (plain::is_plain_source(source)) return plain::open(source, options);
  if (!fs::is_directory(source, ec))
    throw SourceError(fmt::format("{}: neither a directory nor a regular file", source.string()));
  if (deepspeed::is_deepspeed_source(source)) return deepspeed::open(source, options);
  // before Megatron: a verl save dir has a tracker of the same name
  if (verl::is_verl_source(source)) return verl::open(source, options);
  // before DCP: a torch_dist iteration dir is a DCP dir too
  if (megatron::is_megatron_source(source)) return megatron::open(source, options);
  if (dcp::is_dcp_source(source)) return dcp::open(source, options);
  throw SourceError(fmt::format(
      "{}: no checkpoint found (expected a DeepSpeed save dir or tag dir, a Megatron-LM save dir or iteration dir, a verl save dir, or a PyTorch DCP dir)", source.string()));
}

}  // namespace ckptfs
