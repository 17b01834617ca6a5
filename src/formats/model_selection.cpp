#include "formats/model_selection.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <unordered_set>

#include "catalog/dtype_convert.hpp"
#include "ckptfs/error.hpp"

namespace ckptfs::formats {

namespace {

// Top-level keys holding training state rather than model weights (torchtitan keeps the model's
// tensors at the top level beside these).
const std::set<std::string, std::less<>> kNotModel = {
    "optimizer",  "optim", "optimizer_state", "lr_scheduler", "scheduler", "train_state",
    "dataloader", "rng",   "rng_state",       "extra_state"};

std::string joined(const std::vector<std::string>& path, size_t from) {
  std::string out;
  for (size_t i = from; i < path.size(); ++i) out += (i > from ? "." : "") + path[i];
  return out;
}

}  // namespace

std::shared_ptr<catalog::Catalog> select_model(const std::vector<StateEntry>& entries,
                                               const std::filesystem::path& where) {
  const bool has_model = std::any_of(entries.begin(), entries.end(), [](const StateEntry& e) {
    return e.path.size() > 1 && e.path.front() == "model";
  });
  auto out = std::make_shared<catalog::Catalog>();
  std::unordered_set<std::string> names;
  for (const auto& e : entries) {
    if (e.path.empty()) continue;
    if (has_model ? (e.path.front() != "model" || e.path.size() < 2) : kNotModel.contains(e.path.front()))
      continue;
    std::string name = joined(e.path, has_model ? 1 : 0);
    if (!names.insert(name).second)
      throw FormatError(fmt::format("{}: model tensor {} appears twice", where.string(), name));
    catalog::LogicalTensor t = *e.tensor;  // pieces copied, boxes shared
    t.name = std::move(name);
    out->tensors.push_back(std::move(t));
  }
  return out;
}

std::shared_ptr<catalog::Catalog> upcast_to_fp32(const catalog::Catalog& model) {
  auto out = std::make_shared<catalog::Catalog>(model);
  for (auto& t : out->tensors)
    if (t.dtype == DType::F16 || t.dtype == DType::BF16 || catalog::is_float8(t.dtype)) t.dtype = DType::F32;
  return out;
}

}  // namespace ckptfs::formats
