// Which parameters an FSDP1 LOCAL_STATE_DICT save's units hold, in registration order: no rank file names
// them, so they come from config.json's architecture or from the optimizer's record of the run beside the
// rank files (docs/formats/fsdp-per-rank.md#what-ckptfs-serves).
#pragma once

#include <filesystem>
#include <string>
#include <variant>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "formats/fsdp/flat_units.hpp"
#include "formats/fsdp/optimizer_shapes.hpp"
#include "formats/hf_layout.hpp"
#include "formats/rank_state_dict.hpp"

namespace ckptfs::formats::fsdp {

// The parameters the units hold in registration order, and where they come from.
struct UnitParameters {
  std::vector<HfParameter> parameters;  // names without `prefix`
  std::string prefix;  // before the names in the units' modules and the rank files ("", "model.", ...)
  std::string source;  // "config.json's LlamaForCausalLM", for messages
};

// config.json's architecture, unless the optimizer's record of the run disagrees with it; else the
// optimizer's shapes, with the names in the order rank 0's file lists their pieces (use_orig_params) or its
// param groups list them; or why neither. A disagreement is noted in `notes`.
std::variant<UnitParameters, std::string> unit_parameters(
    const std::vector<FlatUnit>& units, const RankStateDict& rank0,
    const std::variant<HfLayout, std::string>& config, const OptimizerRecord& optimizer,
    const std::filesystem::path& optimizer_dir, const OpenOptions& options, std::vector<std::string>& notes);

}  // namespace ckptfs::formats::fsdp
