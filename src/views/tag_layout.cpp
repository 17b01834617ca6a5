#include "ckptfs/layout.hpp"

namespace ckptfs {

std::vector<ViewFile> tag_views(const Tag& tag) {
  return {
      {"model.safetensors", views::make_safetensors(tag.model)},
      {"fp32/pytorch_model.bin", views::make_torch_save(tag.fp32, "pytorch_model")},
      {"fp32/model.safetensors", views::make_safetensors(tag.fp32)},
  };
}

}  // namespace ckptfs
