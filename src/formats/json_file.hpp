// A small JSON file a checkpoint keeps beside its data (config.json, transformer_config.json,
// fsdp_config.json).
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckptfs/io_tree.hpp"

namespace ckptfs::formats {

// The JSON object in `path` (at most `max_bytes`). Throws SourceError when it cannot be read, FormatError
// naming the file when it is not JSON or not an object (exit 4).
nlohmann::json read_json_object(const io::Source& source, const std::filesystem::path& path,
                                uint64_t max_bytes = uint64_t{16} << 20);

}  // namespace ckptfs::formats
