// The torch_dist layout (Megatron's default since core 0.9): a DCP dir whose keys are global parameter
// names with the layers stacked into a leading dimension, plus metadata.json and common.pt.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "formats/dcp/dcp_items.hpp"
#include "formats/megatron/bridge_run_config.hpp"
#include "formats/megatron/bucketed_masters.hpp"
#include "formats/megatron/iteration.hpp"
#include "formats/megatron/model_assembly.hpp"
#include "formats/megatron/module_order.hpp"
#include "formats/megatron/nemo2_layout.hpp"
#include "formats/megatron/stacked_tensors.hpp"
#include "formats/megatron/state_names.hpp"
#include "formats/megatron/torch_dist_keys.hpp"
#include "formats/megatron/verl_layout.hpp"

namespace ckptfs::megatron {

namespace fs = std::filesystem;
using catalog::LogicalTensor;

namespace {

constexpr std::string_view kStackedPrefix = "decoder.layers.";

bool is_stacked(std::string_view key) {
  return key.starts_with(kStackedPrefix) && !parse_layer_name(key).has_value();
}

// Who wrote the iteration, and where its model config comes from.
enum class ConfigSource { megatron_args, bridge_run_config, nemo_model_yaml, verl_transformer_config };

struct SavedConfig {
  ModelArgs args;
  ConfigSource source;
};

// The saved args: common.pt, or (core 0.19+) the common_state bytes item, a torch.save([dict]); a
// Megatron-Bridge save has neither args (its common_state holds none) but run_config.yaml, NeMo 2's weights/
// neither but context/model.yaml beside it, verl's dist_ckpt/ neither but transformer_config.json beside it.
SavedConfig read_config(const fs::path& dir, const dcp::Metadata& md, const dcp::ItemReader& reader,
                        io::FileSet& files, std::vector<fs::path>& used) {
  const fs::path common = dir / "common.pt", run_config = dir / kBridgeRunConfig;
  const std::optional<fs::path> nemo_yaml = nemo2_model_yaml_of_weights(files.source(), dir);
  const std::optional<VerlModelConfig> verl = verl_model_config_of(files.source(), dir);
  const bool stack_config = files.source().is_file(run_config) || nemo_yaml.has_value() || verl.has_value();
  if (files.source().is_file(common)) {
    used.push_back(common);
    const auto archive = torch::TorchArchive::open(files.open(common));
    const formats::Field args = formats::root_field(archive)["args"];
    if (!stack_config || args.present()) return {read_model_args(args), ConfigSource::megatron_args};
  }
  for (const auto& item : md.items)
    if (!item.is_tensor && item.fqn.starts_with("common_state/")) {
      const auto archive = reader.archive(item, item.location);
      const formats::Field args = formats::root_field(archive).at(0)["args"];
      if (!stack_config || args.present()) return {read_model_args(args), ConfigSource::megatron_args};
    }
  if (files.source().is_file(run_config)) {
    used.push_back(run_config);
    return {read_bridge_model_config(files.source(), run_config), ConfigSource::bridge_run_config};
  }
  if (nemo_yaml) {
    used.push_back(*nemo_yaml);
    return {read_nemo_model_config(files.source(), *nemo_yaml), ConfigSource::nemo_model_yaml};
  }
  if (verl) {
    used.insert(used.end(), {verl->transformer_config, verl->hf_config});
    return {read_verl_model_config(files.source(), verl->transformer_config, verl->hf_config),
            ConfigSource::verl_transformer_config};
  }
  throw FormatError(
      fmt::format("{}: no common.pt, no common_state item and no run_config.yaml: the saved args are "
                  "missing",
                  dir.string()));
}

// What inspect calls the save: the stack that wrote it and where its model config came from.
std::string_view format_name(ConfigSource source) {
  switch (source) {
    case ConfigSource::bridge_run_config:
      return "Megatron-Bridge checkpoint (torch_dist; model config: run_config.yaml's model section)";
    case ConfigSource::nemo_model_yaml:
      return "NeMo 2 checkpoint (torch_dist; model config: context/model.yaml's config section)";
    case ConfigSource::verl_transformer_config:
      return "verl Megatron checkpoint (dist_ckpt/ torch_dist; model config: transformer_config.json and "
             "huggingface/config.json)";
    case ConfigSource::megatron_args:
      break;
  }
  return "Megatron-LM checkpoint (torch_dist)";
}

// Model-space tensors keyed by parameter name, unstacked into TP=1 PP=1 names, in Megatron's state-dict
// order (module_order.hpp; for modules it does not know, .metadata's order: what precedes the layers, then
// layer by layer, then what follows).
class Unstacker {
 public:
  Unstacker(const ModelArgs& args, const fs::path& metadata) : args_(args), metadata_(metadata) {}

  void add(const std::string& key, LogicalTensor t) {
    if (!is_stacked(key)) {
      split_experts(key, std::move(t), stacked_.empty() ? before_ : after_);
      return;
    }
    if (t.shape.empty() || t.shape[0] != args_.num_layers)
      throw FormatError(fmt::format("{}: {} stacks {} layers, the saved args say num_layers {}",
                                    metadata_.string(), key, t.shape.empty() ? 0 : t.shape[0],
                                    args_.num_layers));
    stacked_.emplace_back(key, std::move(t));
  }

  std::shared_ptr<catalog::Catalog> finish(DType dtype_override, bool override_dtype) {
    auto out = std::make_shared<catalog::Catalog>();
    const auto push = [&](LogicalTensor t) {
      if (override_dtype) t.dtype = dtype_override;
      out->tensors.push_back(std::move(t));
    };
    for (auto& t : before_) push(std::move(t));
    std::vector<LogicalTensor> layer;
    for (int64_t l = 0; l < args_.num_layers; ++l)
      for (const auto& [key, t] : stacked_) {
        const std::string name = fmt::format("{}{}.{}", kStackedPrefix, l, key.substr(kStackedPrefix.size()));
        split_experts(name, stacked_entry(t, l, name), layer);
        for (auto& x : layer) push(std::move(x));
        layer.clear();
      }
    for (auto& t : after_) push(std::move(t));
    sort_into_module_order(out->tensors);
    return out;
  }

 private:
  // A layer's tensor under its TP=1 name; the experts of `mlp.experts.experts.*` (stacked along their
  // first dimension) one by one.
  void split_experts(const std::string& name, LogicalTensor t, std::vector<LogicalTensor>& out) const {
    if (name.find(".experts.experts.") == std::string::npos) {
      t.name = args_.local_spec ? local_spec_name(name) : name;
      out.push_back(std::move(t));
      return;
    }
    if (t.shape.empty() || t.shape[0] != args_.num_experts)
      throw FormatError(fmt::format("{}: {} stacks {} experts, the saved args say num_experts {}",
                                    metadata_.string(), name, t.shape.empty() ? 0 : t.shape[0],
                                    args_.num_experts));
    for (int64_t e = 0; e < args_.num_experts; ++e)
      out.push_back(stacked_entry(t, e, expert_name(name, e, args_.moe_grouped_gemm)));
  }

  const ModelArgs& args_;
  fs::path metadata_;
  std::vector<LogicalTensor> before_, after_;
  std::vector<std::pair<std::string, LogicalTensor>> stacked_;
};

// Why the masters saved under model keys are not in the model's shapes (after unflatten_fragments), or
// nullopt.
std::optional<std::string> off_model_shape(const catalog::Catalog& masters, const catalog::Catalog& model) {
  std::map<std::string_view, const LogicalTensor*> shapes;
  for (const auto& t : model.tensors) shapes.emplace(t.name, &t);
  for (const auto& t : masters.tensors) {
    const auto it = shapes.find(t.name);
    if (it == shapes.end() || it->second->shape != t.shape)
      return fmt::format("the master of {} is saved as [{}], not in the model's shape", t.name,
                         fmt::join(t.shape, ", "));
  }
  return std::nullopt;
}

}  // namespace

bool is_torch_dist_iteration(const io::Source& source, const fs::path& dir) {
  return source.is_file(dir / "metadata.json") && source.is_file(dir / ".metadata");
}

Iteration read_torch_dist_iteration(io::FileSet& files, const fs::path& dir, const std::string& name) {
  const fs::path marker = dir / "metadata.json";
  nlohmann::json backend;
  try {
    backend = nlohmann::json::parse(files.source().read_small_file(marker, uint64_t{16} << 20).value_or(""));
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(fmt::format("{}: not JSON: {}", marker.string(), e.what()));
  }
  if (!backend.is_object() || backend.value("sharded_backend", "") != "torch_dist")
    throw UnsupportedError(fmt::format("{}: sharded_backend {} (ckptfs reads torch_dist)", marker.string(),
                                       backend.is_object() && backend.contains("sharded_backend")
                                           ? backend["sharded_backend"].dump()
                                           : "missing"));
  dcp::ItemReader reader(files, dir);
  const dcp::Metadata md = dcp::read_metadata(files.source(), reader.metadata_path());
  Iteration it;
  it.tag.name = name;
  it.tag.dir = dir;
  it.tag.files = {marker, reader.metadata_path()};
  const SavedConfig config = read_config(dir, md, reader, files, it.tag.files);
  it.args = config.args;
  it.tag.format = format_name(config.source);
  // NeMo 2's MegatronParallel saves the model under `module.`
  const std::string_view wrapper = config.source == ConfigSource::nemo_model_yaml ? "module." : "";
  const ModelArgs& args = it.args;

  Unstacker model(args, reader.metadata_path()), masters(args, reader.metadata_path());
  bool has_masters = false;
  // The distributed optimizer's dp_reshardable and dp_zero_gather_scatter layouts keep masters per
  // model-parallel domain (bucket tensors, pickled objects), not in the model's geometry.
  const bool bucketed = has_bucketed_masters(md);
  std::set<fs::path> data_files;
  std::map<std::string_view, const dcp::Item*> items_by_key;
  for (const auto& item : md.items) items_by_key.emplace(item.fqn, &item);
  for (const auto& item : md.items) {
    if (!item.is_tensor) continue;
    const TorchDistKey kind = classify_torch_dist_key(item.fqn);
    const bool master = std::holds_alternative<MasterKey>(kind);
    if (!master && !std::holds_alternative<ModelKey>(kind)) continue;
    const std::string_view saved = master ? std::get<MasterKey>(kind).name : std::get<ModelKey>(kind).name;
    if (!saved.starts_with(wrapper))
      throw FormatError(fmt::format("{}: {} lacks the {} prefix NeMo 2 saves every model key under",
                                    reader.metadata_path().string(), item.fqn, wrapper));
    const std::string_view key = saved.substr(wrapper.size());
    LogicalTensor t = reader.tensor(item);
    if (const auto model_item = items_by_key.find(saved); master && model_item != items_by_key.end())
      if (auto unflattened = unflatten_fragments(t, model_item->second->size)) t = std::move(*unflattened);
    for (const auto& f : t.files()) data_files.insert(f->path());
    (master ? masters : model).add(std::string(key), std::move(t));
    has_masters = has_masters || master;
  }
  it.tag.add(ViewRole::model, model.finish(DType::F32, false));
  check_against_args(*it.tag.catalog(ViewRole::model), args, reader.metadata_path().string());
  if (args.params_dtype == DType::F32) {
    it.tag.add(ViewRole::fp32, it.tag.catalog(ViewRole::model));
  } else if (has_masters) {
    auto fp32 = masters.finish(DType::F32, true);
    if (const auto why = off_model_shape(*fp32, *it.tag.catalog(ViewRole::model)))
      it.tag.notes.push_back(fmt::format("no fp32 master weights: {}, so no fp32/ views", *why));
    else
      it.tag.add(ViewRole::fp32, std::move(fp32));
  } else if (bucketed) {
    try {
      it.tag.add(ViewRole::fp32, masters_from_buckets(md, reader, *it.tag.catalog(ViewRole::model), args));
    } catch (const UnsupportedError& e) {
      it.tag.notes.push_back(fmt::format("no fp32 master weights: {}, so no fp32/ views", e.what()));
    }
  } else {
    it.tag.notes.push_back("no fp32 master weights saved (no optimizer state): no fp32/ views");
  }
  if (it.tag.has(ViewRole::fp32))
    for (const auto& t : it.tag.catalog(ViewRole::fp32)->tensors)
      for (const auto& f : t.files()) data_files.insert(f->path());
  it.tag.files.insert(it.tag.files.end(), data_files.begin(), data_files.end());
  it.tag.topology.optimizer = has_masters ? "Megatron optimizer (fp32 masters in model space)"
                              : bucketed  ? "Megatron distributed optimizer (state per model-parallel domain)"
                                          : "none saved";
  return it;
}

}  // namespace ckptfs::megatron
