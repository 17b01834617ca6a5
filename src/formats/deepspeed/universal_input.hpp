// DeepSpeed universal checkpoints as input (docs/formats/universal.md): a `<tag>_universal/` dir holds
// the model-state files of the run and zero/<param>/fp32.pt per trainable parameter, which take the place
// of the partitioned optimizer files as the source of the fp32 masters.
#pragma once

#include <filesystem>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/io_tree.hpp"
#include "formats/deepspeed/state_files.hpp"

namespace ckptfs::deepspeed {

// True when `dir` holds zero/optimizer_state.pt (what ds_to_universal writes).
bool is_universal_dir(const io::Source& source, const std::filesystem::path& dir);

// The fp32 masters of the params of `groups` (param_shapes of a model-state file, in order), each read
// from <dir>/zero/<name>/fp32.pt ({'param': T, ...} or a bare tensor) and shaped as param_shapes says.
// Of a run over `tp` > 1 tensor-parallel ranks, param_shapes gives one rank's slice and the file the
// merged tensor ({'param', 'cat_dim'} or, replicated, {'param'}): the master keeps the file's shape.
// Throws FormatError naming the file when one is missing or does not hold the param's elements.
std::vector<catalog::LogicalTensor> read_universal_masters(io::FileSet& files,
                                                           const std::filesystem::path& dir,
                                                           const std::vector<std::vector<NamedShape>>& groups,
                                                           int tp = 1);

// The fp32 masters of `names` in the shapes their files hold (model-state copies without param_shapes).
std::vector<catalog::LogicalTensor> read_named_universal_masters(io::FileSet& files,
                                                                 const std::filesystem::path& dir,
                                                                 const std::vector<std::string>& names);

// The names of the parameter folders under <dir>/zero, sorted.
std::vector<std::string> universal_param_dirs(const io::Source& source, const std::filesystem::path& dir);

}  // namespace ckptfs::deepspeed
