// Wrapper prefixes before a model's Hugging Face names: a LightningModule's attribute ("model.", before
// Lightning 2.1 "_forward_module.model."), DDP's "module.", OpenRLHF's and others'. Found against the
// architecture's own names (formats/hf_layout.hpp) and stripped so that from_pretrained reads the mount.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "ckptfs/checkpoint.hpp"
#include "formats/hf_layout.hpp"

namespace ckptfs::formats {

// The text before the layout's names in `names` (parameter names, or module paths such as FSDP units'): the
// one most names carry before a name or module of the layout; "" when they are the layout's own; nullopt
// when no name ends with one of the layout's.
std::optional<std::string> layout_prefix(const std::vector<std::string>& names, const HfLayout& layout);

// `model` with `prefix` removed from the names that start with it (the others kept as they are). Throws
// FormatError naming the tensor when two names become one.
std::shared_ptr<catalog::Catalog> strip_prefix(const catalog::Catalog& model, const std::string& prefix);

// Strips, in every tag's model and fp32 catalogs, OpenOptions::strip_prefix or else the prefix that makes
// the names those of the architecture a config.json names (the tag dir's, else the save dir's), and notes
// what it stripped. Names that are the architecture's already are left as they are.
void strip_wrapper_prefixes(const io::Source& source, Checkpoint& checkpoint, const OpenOptions& options);

}  // namespace ckptfs::formats
