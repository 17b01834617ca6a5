// One DCP checkpoint (a step): its DCP dirs read into catalogs (every tensor as boxes of the .distcp
// chunks), the model and fp32 catalogs the weight views show, and the nested state dict of each dir.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/io.hpp"

namespace ckptfs::dcp {

// `dcp_dirs`: the DCP dirs of the step (the step dir itself, or accelerate's pytorch_model_fsdp_0/ and
// optimizer_0/); the model views come from the first whose name starts with "pytorch_model" or
// "model", else from the first.
Tag read_tag(io::FileSet& files, const std::filesystem::path& dir, const std::string& name,
             const std::vector<std::filesystem::path>& dcp_dirs);

}  // namespace ckptfs::dcp
