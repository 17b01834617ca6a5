// Value trees read from pickles (an optimizer's global state, DCP bytes items) turned into trees a
// torch.save view can write: every tensor becomes a catalog::tensor_value of a logical tensor.
#pragma once

#include <memory>
#include <string>

#include "ckptfs/catalog.hpp"
#include "ckptfs/pickle.hpp"

namespace ckptfs::formats {

// Copies `root` with every tensor replaced by a catalog::tensor_value of a whole-tensor copy appended to
// `tensors` (named "<label>[i]", in pickling order); subtrees without tensors and repeated references
// are shared, not copied.
pickle::ValuePtr with_logical_tensors(const pickle::ValuePtr& root, std::shared_ptr<catalog::Catalog> tensors,
                                      const std::string& label);

}  // namespace ckptfs::formats
