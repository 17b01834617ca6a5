// verl's run dir, whatever the backend (FSDP or Megatron): a global_step_N/ dir per save and the tracker
// latest_checkpointed_iteration.txt, which RayPPOTrainer writes (str(global_steps)) after the step's files.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "formats/save_dir.hpp"

namespace ckptfs::formats::verl {

constexpr const char* kStepTracker = "latest_checkpointed_iteration.txt";

bool is_step_name(const std::string& name);  // global_step_N

// The step dir the tracker in `root` names; nullopt without a tracker. Throws FormatError when it holds
// something else than a step number.
std::optional<Tracked> tracked_step(const io::Source& source, const std::filesystem::path& root);

}  // namespace ckptfs::formats::verl
