#include <fmt/format.h>

#include "ckptfs/error.hpp"
#include "ckptfs/layout.hpp"

namespace ckptfs {

std::vector<ViewFile> tag_views(const Tag& tag) {
  // The view builders know the tensors, not where they come from: their errors (a name that appears
  // twice, a header over the size limit) get the tag directory.
  try {
    return {
        {"model.safetensors", views::make_safetensors(tag.model)},
        {"fp32/pytorch_model.bin", views::make_torch_save(tag.fp32, "pytorch_model")},
        {"fp32/model.safetensors", views::make_safetensors(tag.fp32)},
    };
  } catch (const UnsupportedError& e) {
    throw UnsupportedError(fmt::format("{}: {}", tag.dir.string(), e.what()));
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("{}: {}", tag.dir.string(), e.what()));
  }
}

}  // namespace ckptfs
