// The files ckptfs shows for one tag, shared by `inspect`, `export` and the mount.
#pragma once

#include <string>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/views.hpp"

namespace ckptfs {

struct ViewFile {
  std::string path;  // relative: "model.safetensors", "fp32/pytorch_model.bin", ...
  views::VirtualFilePtr file;
};

// model.safetensors (training dtype), fp32/pytorch_model.bin and fp32/model.safetensors (fp32 masters).
std::vector<ViewFile> tag_views(const Tag& tag);

}  // namespace ckptfs
