// libFuzzer target: a model-state pickle's universal_checkpoint_info (pattern lists compiled for RE2,
// sub-parameter entries, shard widths, version, vocabulary size), then every string of the pickle matched
// as a parameter name against the lists, as the tensor-parallel merge matches them.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "ckptfs/error.hpp"
#include "ckptfs/pickle.hpp"
#include "formats/deepspeed/tensor_parallel_merge.hpp"

namespace {

using ckptfs::pickle::Value;

// Visits at most `budget` strings of `v` (a tree: shared subtrees are visited once per reference).
void each_string(const Value& v, size_t& budget, const std::function<void(const std::string&)>& visit) {
  if (budget == 0) return;
  if (v.kind == ckptfs::pickle::Kind::String) {
    --budget;
    visit(v.text);
  }
  for (const auto& item : v.items)
    if (item) each_string(*item, budget, visit);
  for (const auto& [key, value] : v.entries) {
    if (key) each_string(*key, budget, visit);
    if (value) each_string(*value, budget, visit);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptfs::pickle::UnpickleOptions options;
  options.persistent_load = [](const ckptfs::pickle::ValuePtr&) {
    return ckptfs::pickle::make_value(ckptfs::pickle::Kind::None);  // the tensors' storages
  };
  try {
    const auto root = ckptfs::pickle::unpickle(std::as_bytes(std::span(data, size)), options);
    const auto info = ckptfs::deepspeed::read_universal_info(root, "mp_rank_00_model_states.pt");
    size_t budget = 1024;
    each_string(*root, budget, [&](const std::string& name) {
      std::string pattern;
      info.sub_params_of(name, &pattern);
      info.vocabulary.matches(name);
      try {
        info.split_of(name);
      } catch (const ckptfs::UnsupportedError&) {  // an averaged parameter
      }
    });
  } catch (const ckptfs::Error&) {
  }
  return 0;
}
