// The parameters' full shapes an optimizer's DCP dir records beside FSDP's per-rank model files
// (accelerate's optimizer_{I}/, keys "optimizer.state.<parameter>.<state>"): the one record of shapes a
// LOCAL_STATE_DICT save has besides the model's config.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace ckptfs::formats::fsdp {

// Parameter name -> full shape, from the first non-scalar state tensor of each parameter; empty when `dir`
// is no DCP dir. Throws FormatError naming the metadata file when it cannot be read.
std::map<std::string, std::vector<int64_t>> optimizer_parameter_shapes(const std::filesystem::path& dir);

}  // namespace ckptfs::formats::fsdp
