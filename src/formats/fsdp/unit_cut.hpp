// An FSDP unit's flat parameter cut into the model's parameters: the unit's own parameters (not those of
// nested units) in registration order, tied ones once, each starting on the alignment FSDP padded to with
// use_orig_params (16 bytes of the compute dtype), the flat parameter padded at its end to divide by the
// world size (docs/formats/fsdp-per-rank.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "formats/fsdp/flat_units.hpp"
#include "formats/hf_layout.hpp"

namespace ckptfs::formats::fsdp {

struct CutParameter {
  std::string name;  // as the layout names it (no prefix)
  std::vector<int64_t> shape;
  int64_t first = 0;  // its first element in the flat parameter
};

struct CutUnit {
  const FlatUnit* unit = nullptr;
  int64_t alignment = 1;  // elements each parameter starts on a multiple of
  int64_t padding = 0;    // elements of padding found (between parameters and at the end)
  std::vector<CutParameter> parameters;
};

// The cut of every unit by `parameters` (in registration order: an HfLayout's, or the names the rank files
// list with an optimizer's shapes), whose modules carry `prefix` before those names ("" or "model." ...); or
// why they do not fit (a parameter in no unit, a unit whose sizes do not add up). `source` names where the
// parameters come from, for that message ("config.json's LlamaForCausalLM").
std::variant<std::vector<CutUnit>, std::string> cut_units(const std::vector<FlatUnit>& units,
                                                          const std::vector<HfParameter>& parameters,
                                                          const std::string& prefix, int64_t world_size,
                                                          const std::string& source);

// The model: every one of `parameters` in its order, cut out of its unit (a tied one the same elements as
// its target), in the flat parameters' dtype, named as the rank files name them (`prefix` before the names:
// strip_wrapper_prefixes takes it off, as for every format).
std::shared_ptr<catalog::Catalog> cut_model(const std::vector<CutUnit>& cut,
                                            const std::vector<HfParameter>& parameters,
                                            const std::string& prefix);

}  // namespace ckptfs::formats::fsdp
