#include "formats/deepspeed/universal_input.hpp"

#include <fmt/format.h>

#include "ckptfs/error.hpp"
#include "ckptfs/torch.hpp"
#include "formats/deepspeed/partition_assembly.hpp"

namespace ckptfs::deepspeed {

namespace fs = std::filesystem;

bool is_universal_dir(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "zero" / "optimizer_state.pt", ec);
}

std::vector<catalog::LogicalTensor> read_universal_masters(io::FileSet& files, const fs::path& dir,
                                                           const std::vector<std::vector<NamedShape>>& groups) {
  std::vector<catalog::LogicalTensor> out;
  for (const auto& group : groups) {
    for (const auto& param : group) {
      const fs::path path = dir / "zero" / param.name / "fp32.pt";
      std::error_code ec;
      if (!fs::is_regular_file(path, ec))
        throw FormatError(fmt::format("{}: missing: the universal checkpoint has no fp32 masters of {}",
                                      path.string(), param.name));
      const auto archive = torch::TorchArchive::open(files.open(path));
      const pickle::Value* root = archive.root().get();
      const torch::SourceTensor* t = root->is(pickle::Kind::Dict) ? torch::as_tensor(root->find("param"))
                                                                  : torch::as_tensor(root);
      if (t == nullptr)
        throw FormatError(fmt::format("{}: holds neither a tensor nor a dict with 'param'", path.string()));
      if (t->numel() != param.numel)
        throw FormatError(fmt::format("{}: holds {} elements but param_shapes gives {} {} elements",
                                      path.string(), t->numel(), param.name, param.numel));
      catalog::LogicalTensor master = whole_tensor(param.name, *t, DType::F32, "universal fp32.pt");
      master.shape = param.shape;  // ZeRO-3 trees hold 1-D tensors; the elements are in the same order
      out.push_back(std::move(master));
    }
  }
  return out;
}

}  // namespace ckptfs::deepspeed
