#include "formats/deepspeed/universal_input.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/torch.hpp"
#include "formats/deepspeed/partition_assembly.hpp"

namespace ckptfs::deepspeed {

namespace fs = std::filesystem;

namespace {

std::optional<int64_t> int_entry(const pickle::Value* dict, std::string_view key) {
  const pickle::Value* v = dict->is(pickle::Kind::Dict) ? dict->find(key) : nullptr;
  if (v == nullptr || !v->is(pickle::Kind::Int)) return std::nullopt;
  return v->integer;
}

bool true_entry(const pickle::Value* dict, std::string_view key) {
  const pickle::Value* v = dict->is(pickle::Kind::Dict) ? dict->find(key) : nullptr;
  return v != nullptr && v->is(pickle::Kind::Bool) && v->boolean;
}

// A tensor-parallel run's file holds the whole tensor of a param whose param_shapes entry is one TP rank's
// slice: the same shape when replicated (no cat_dim), `tp` slices along cat_dim otherwise (a vocabulary
// tensor may have lost its padding rows), `tp` times the elements for fused sub-params.
void require_merged_shape(const fs::path& path, const pickle::Value* root, const torch::SourceTensor& t,
                          const NamedShape& param, int tp) {
  const auto cat_dim = int_entry(root, "cat_dim");
  bool fits = t.shape.size() == param.shape.size();
  if (root->is(pickle::Kind::Dict) && root->find("sub_param_shape") != nullptr) {
    fits = t.numel() == param.numel * static_cast<uint64_t>(tp);
  } else if (fits) {
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (!cat_dim || static_cast<int64_t>(d) != *cat_dim)
        fits = fits && t.shape[d] == param.shape[d];
      else if (true_entry(root, "vocab_tensor"))
        fits = fits && t.shape[d] <= param.shape[d] * tp;
      else
        fits = fits && t.shape[d] == param.shape[d] * tp;
    }
    fits = fits && (!cat_dim || (*cat_dim >= 0 && *cat_dim < static_cast<int64_t>(t.shape.size())));
  }
  if (!fits)
    throw FormatError(
        fmt::format("{}: holds a tensor of shape {} ({}), which is not {} merged over {} tensor-parallel "
                    "ranks of shape {}",
                    path.string(), t.shape, cat_dim ? fmt::format("cat_dim {}", *cat_dim) : "replicated",
                    param.name, tp, param.shape));
}

}  // namespace

bool is_universal_dir(const io::Source& source, const fs::path& dir) {
  return source.is_file(dir / "zero" / "optimizer_state.pt");
}

namespace {

// The 'param' tensor (or bare tensor) of <dir>/zero/<name>/fp32.pt; `root` receives the file's object.
struct UniversalMaster {
  fs::path path;
  torch::TorchArchive archive;
  const pickle::Value* root;
  const torch::SourceTensor* tensor;
};

UniversalMaster open_master(io::FileSet& files, const fs::path& dir, const std::string& name) {
  fs::path path = dir / "zero" / name / "fp32.pt";
  if (!files.source().is_file(path))
    throw FormatError(
        fmt::format("{}: missing: the universal checkpoint has no fp32 masters of {}", path.string(), name));
  auto archive = torch::TorchArchive::open(files.open(path));
  const pickle::Value* root = archive.root().get();
  const torch::SourceTensor* t =
      root->is(pickle::Kind::Dict) ? torch::as_tensor(root->find("param")) : torch::as_tensor(root);
  if (t == nullptr)
    throw FormatError(fmt::format("{}: holds neither a tensor nor a dict with 'param'", path.string()));
  return {std::move(path), std::move(archive), root, t};
}

}  // namespace

std::vector<catalog::LogicalTensor> read_universal_masters(io::FileSet& files, const fs::path& dir,
                                                           const std::vector<std::vector<NamedShape>>& groups,
                                                           int tp) {
  std::vector<catalog::LogicalTensor> out;
  for (const auto& group : groups) {
    for (const auto& param : group) {
      const UniversalMaster m = open_master(files, dir, param.name);
      if (tp > 1) {
        require_merged_shape(m.path, m.root, *m.tensor, param, tp);
        out.push_back(
            whole_tensor(param.name, *m.tensor, DType::F32, "universal fp32.pt (merged over TP ranks)"));
        continue;
      }
      if (m.tensor->numel() != param.numel)
        throw FormatError(fmt::format("{}: holds {} elements but param_shapes gives {} {} elements",
                                      m.path.string(), m.tensor->numel(), param.name, param.numel));
      catalog::LogicalTensor master = whole_tensor(param.name, *m.tensor, DType::F32, "universal fp32.pt");
      master.shape = param.shape;  // ZeRO-3 trees hold 1-D tensors; the elements are in the same order
      out.push_back(std::move(master));
    }
  }
  return out;
}

std::vector<catalog::LogicalTensor> read_named_universal_masters(io::FileSet& files, const fs::path& dir,
                                                                 const std::vector<std::string>& names) {
  std::vector<catalog::LogicalTensor> out;
  for (const auto& name : names) {
    const UniversalMaster m = open_master(files, dir, name);
    out.push_back(whole_tensor(name, *m.tensor, DType::F32, "universal fp32.pt"));
  }
  return out;
}

std::vector<std::string> universal_param_dirs(const io::Source& source, const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : source.list_directory(dir / "zero"))
    if (e.is_directory) names.push_back(e.path.filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ckptfs::deepspeed
