// The catalogs of one DeepSpeed tag made from what its files contribute (TagParts), and its universal plan
// (docs/formats/deepspeed.md, Views):
//   fp32:  buffers (float ones upcast), frozen params (upcast), trainable fp32 masters, tied aliases;
//   model: the weights in the training dtype, in `module` (or pipeline layer) order.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "ckptfs/checkpoint.hpp"
#include "formats/deepspeed/tag_parts.hpp"

namespace ckptfs::deepspeed {

// Position of every tensor by name (models have up to hundreds of thousands of tensors: no linear scans).
std::unordered_map<std::string, size_t> index_by_name(const std::vector<catalog::LogicalTensor>& tensors);

// `module` as logical tensors in the dtype it was saved in.
std::vector<catalog::LogicalTensor> module_tensors(const TagParts& parts);

// fp32 master weights in zero_to_fp32's order: buffers, frozen, trainable, tied aliases. `module` holds
// the model's weights (the module entries, or those merged over tensor-parallel ranks).
catalog::Catalog build_fp32_catalog(const TagParts& parts, const std::vector<catalog::LogicalTensor>& module,
                                    std::vector<std::string>& notes);

// Weights as the model holds them: `module` entries for ZeRO-0/1/2; for ZeRO-3 (placeholders in module)
// the fp32 masters rounded to each parameter's dtype, frozen fragments and full buffers.
catalog::Catalog build_model_catalog(const TagParts& parts, bool zero3, std::vector<std::string>& notes);

// A universal checkpoint's zero/<param>/fp32.pt files are files of the tag.
void add_master_files(Tag& tag, const TagParts& parts);

// Checks the catalogs of a tag and adds them with its universal plan.
void finish_tag(Tag& tag, TagParts& parts, std::shared_ptr<catalog::Catalog> fp32, CatalogPtr model,
                bool zero3);

}  // namespace ckptfs::deepspeed
