#include "formats/verl/steps.hpp"

#include <fmt/format.h>

#include "ckptfs/error.hpp"

namespace ckptfs::formats::verl {

bool is_step_name(const std::string& name) {
  return name.starts_with("global_step_") && is_decimal(std::string_view(name).substr(12));
}

std::optional<Tracked> tracked_step(const io::Source& source, const std::filesystem::path& root) {
  const auto text = read_tracker(source, root / kStepTracker);
  if (!text) return std::nullopt;
  if (!is_decimal(*text) || text->size() > 18)  // std::stoll's range
    throw FormatError(fmt::format("{}: holds '{}', expected a step number", (root / kStepTracker).string(),
                                  text->substr(0, 40)));
  return Tracked{root / kStepTracker, "global_step_" + std::to_string(std::stoll(*text)), "step dir"};
}

}  // namespace ckptfs::formats::verl
