// FSDP1 LOCAL_STATE_DICT saves: each FSDP unit's flat parameter, one ShardedTensor per rank file under
// "<module>._flat_param" (the root unit's "_flat_param"), put back together from every rank's chunk
// (docs/formats/fsdp-per-rank.md).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "formats/rank_state_dict.hpp"

namespace ckptfs::formats::fsdp {

inline constexpr std::string_view kFlatParamKey = "_flat_param";

// Where a rank's piece of an original parameter (use_orig_params: saved under the parameter's name as a 1-D
// view of the rank's flat chunk) sits in its unit's flat parameter: the one record of the padding FSDP put
// between parameters.
struct OrigPiece {
  std::string name;  // as saved (any wrapper prefix included)
  int64_t first = 0, count = 0;
};

struct FlatUnit {
  std::string key;     // "model.layers.0._flat_param"
  std::string module;  // "model.layers.0"; "" for the root unit
  DType dtype = DType::F32;
  int64_t numel = 0;  // the flat parameter's elements (with use_orig_params its world-size padding too)
  std::vector<std::pair<int64_t, torch::SourceTensor>>
      chunks;                     // (first element, rank's chunk), tiling [0, numel)
  std::vector<OrigPiece> pieces;  // the non-empty pieces of every rank, empty without use_orig_params
};

// True for a state-dict key FSDP gives a unit's flat parameter.
bool is_flat_param_key(std::string_view key);

// Every unit of the ranks' files, in rank 0's order, with the original parameters' pieces found in each
// rank's chunk (plain 1-D tensors viewing the chunk's storage). Throws FormatError naming the file when there
// is none, a rank lacks a unit or has a ShardedTensor other than rank 0's (size, dtype, shard placements),
// rank r's file is not rank r's of a world of the files' number, or a flat parameter is no ShardedTensor.
std::vector<FlatUnit> gather_flat_units(const std::vector<RankStateDict>& ranks);

// The elements of a tensor of `shape`.
int64_t shape_numel(const std::vector<int64_t>& shape);

// Elements [first, first + numel(shape)) of `unit`'s flat parameter as the tensor `name` of `shape`.
catalog::LogicalTensor flat_slice(const FlatUnit& unit, std::string name, std::vector<int64_t> shape,
                                  int64_t first, std::string origin);

}  // namespace ckptfs::formats::fsdp
