// A lone torch.save or safetensors file: its tensors in one tag, the model views chosen by
// formats::select_model (the 'model' subtree of a nested training state, else every tensor).
#include <fmt/format.h>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/plain.hpp"
#include "ckptfs/torch.hpp"
#include "formats/model_selection.hpp"
#include "formats/plain/safetensors_reader.hpp"
#include "formats/save_dir.hpp"

namespace ckptfs::plain {

namespace fs = std::filesystem;
using catalog::Catalog;

namespace {

constexpr size_t kMaxDepth = 64;

struct Found {
  std::vector<std::string> path;
  torch::SourceTensor tensor;
};

// Every tensor of a torch.save value tree with the keys leading to it: dict keys (str or int), list and
// tuple indexes. Objects other than containers are not searched (an optimizer's LossScaler, ...).
void walk(const pickle::Value& v, std::vector<std::string>& path, std::vector<Found>& out) {
  if (path.size() > kMaxDepth) return;
  if (const auto* t = torch::as_tensor(v)) {
    out.push_back({path, *t});
    return;
  }
  const auto visit = [&](std::string key, const pickle::Value& child) {
    path.push_back(std::move(key));
    walk(child, path, out);
    path.pop_back();
  };
  if (v.is(pickle::Kind::Dict)) {
    for (const auto& [k, child] : v.entries) {
      if (k->is(pickle::Kind::String))
        visit(k->text, *child);
      else if (k->is(pickle::Kind::Int))
        visit(std::to_string(k->integer), *child);
    }
  } else if (v.is(pickle::Kind::List) || v.is(pickle::Kind::Tuple)) {
    for (size_t i = 0; i < v.items.size(); ++i) visit(std::to_string(i), *v.items[i]);
  }
}

std::vector<Found> tensors_of(io::FileSet& files, const fs::path& root) {
  std::vector<Found> out;
  const io::FilePtr file = files.open(root);
  if (root.extension() == ".safetensors") {
    for (auto& e : read_safetensors(file)) out.push_back({{e.name}, std::move(e.tensor)});
    return out;
  }
  const auto archive = torch::TorchArchive::open(file);
  std::vector<std::string> path;
  walk(*archive.root(), path, out);
  if (out.empty()) throw FormatError(fmt::format("{}: holds no tensor", root.string()));
  return out;
}

// The file's one tag: its tensors as "state", the model views chosen among them.
Tag read_file_tag(io::FileSet& files, const std::string& name, const fs::path& root) {
  const auto found = tensors_of(files, root);
  auto all = std::make_shared<Catalog>();
  for (const auto& f : found) {
    std::string joined;
    for (const auto& k : f.path) joined += (joined.empty() ? "" : ".") + k;
    all->tensors.push_back(catalog::whole_tensor(joined, f.tensor, f.tensor.dtype, "saved tensor"));
  }
  std::vector<formats::StateEntry> entries;
  for (size_t i = 0; i < found.size(); ++i) entries.push_back({found[i].path, {all, i}});
  auto model = formats::select_model(entries, root);
  Tag tag;
  tag.name = name;
  tag.dir = root;
  tag.format = root.extension() == ".safetensors" ? "safetensors file" : "torch.save file";
  tag.files = {root};
  for (const auto& t : model->tensors)
    if (dtype_is_floating(t.dtype)) {
      tag.topology.train_dtype = t.dtype;
      break;
    }
  tag.topology.optimizer = "-";
  tag.add(ViewRole::fp32, formats::upcast_to_fp32(*model));
  tag.add(ViewRole::model, std::move(model));
  tag.states.emplace("state", std::move(all));
  return tag;
}

}  // namespace

bool is_plain_source(const io::Source& source, const fs::path& root) {
  return source.is_file(root);
}

Checkpoint open(const io::Source& source, const fs::path& root, const OpenOptions& options) {
  formats::SaveDir<fs::path> file(root.extension() == ".safetensors" ? "safetensors" : "torch.save", root);
  file.tags.emplace_back(root.filename().string(), root);
  return formats::open_save_dir(source, std::move(file), options, read_file_tag);
}

}  // namespace ckptfs::plain
