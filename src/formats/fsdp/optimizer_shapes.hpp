// What an optimizer's DCP dir records of the model beside FSDP's per-rank model files (accelerate's
// optimizer_{I}/, FSDP.optim_state_dict saved by torch.distributed.checkpoint): each parameter's full
// shape (keys "optimizer.state.<parameter>.<state>") and the parameters of each group in the flat
// parameters' order ("optimizer.param_groups.<g>.params"): with config.json, the only record of names and
// shapes a LOCAL_STATE_DICT save has.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ckptfs/io.hpp"

namespace ckptfs::formats::fsdp {

struct OptimizerRecord {
  std::map<std::string, std::vector<int64_t>> shapes;  // from its exp_avg, exp_avg_sq, momentum_buffer or sum
  std::vector<std::string> order;                      // every group's parameters, groups in order
};

// The record of `dir`; empty when `dir` is no DCP dir. Throws FormatError naming the metadata file when it
// cannot be read or two states of a parameter disagree on its shape.
OptimizerRecord read_optimizer_record(io::FileSet& files, const std::filesystem::path& dir);

}  // namespace ckptfs::formats::fsdp
