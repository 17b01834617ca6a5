// A checkpoint directory as ckptfs understands it, whatever the framework: its tags (saved steps), and
// per tag the topology and its named catalogs (fp32 master weights, model weights in the training dtype,
// optimizer state); DeepSpeed tags also their ZeRO stage and what they offer as a universal checkpoint.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "ckptfs/dtype.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/pickle.hpp"

namespace ckptfs {

struct Topology {
  int dp = 1;  // data-parallel world size the optimizer state is partitioned over
  int tp = 1;
  int pp = 1;
  int ep = 1;             // expert-parallel size (DeepSpeed MoE)
  int experts = 0;        // experts of all MoE layers (0: no MoE)
  std::string optimizer;  // as the framework names it: "DeepSpeedZeroOptimizer", "Megatron ..."
  DType train_dtype = DType::F32;
};

using CatalogPtr = std::shared_ptr<const catalog::Catalog>;

// What a catalog of a model's weights is served as, in that model's folder (the mount root, or verl's
// critic/): model.safetensors (model: the training dtype), fp32/pytorch_model.bin and fp32/model.safetensors
// (fp32: master weights, the zero_to_fp32 equivalent), hf/model.safetensors (hf: Hugging Face names).
enum class ViewRole { model, fp32, hf };
std::string_view role_name(ViewRole role);  // "model", "fp32", "hf"

// One trainable parameter of a universal checkpoint: zero/<name>/{fp32,<state keys>,step}.pt.
struct UniversalParam {
  std::string name;
  catalog::TensorRef fp32;                // its master (in the tag's "fp32" catalog)
  std::vector<catalog::TensorRef> state;  // aligned with UniversalPlan::state_keys
  pickle::ValuePtr step;                  // step.pt (its group's step); null: no step.pt
  // The keys ds_to_universal writes before 'param' in the dict form (how tensor-parallel slices were
  // joined: cat_dim, param_n_sub_params, vocab_tensor); unset: {'cat_dim': 0}.
  std::optional<std::vector<std::pair<std::string, pickle::ValuePtr>>> merge_keys;
};

// What a tag offers as a DeepSpeed universal checkpoint (docs/formats/universal.md): the optimizer's
// parameters with their fp32 masters and per-parameter state, the global optimizer state and the
// model-state files that ds_to_universal copies.
struct UniversalPlan {
  bool bare_tensors = false;            // ZeRO-3: bare 1-D tensors; else {'cat_dim': 0, 'param': T}
  std::vector<std::string> state_keys;  // "exp_avg", "exp_avg_sq", ...
  std::vector<UniversalParam> params;   // trainable parameters, as the optimizer lists them
  pickle::ValuePtr optimizer_state;     // zero/optimizer_state.pt (tensors as catalog::tensor_value)
  std::vector<std::filesystem::path> model_state_files;  // copied byte for byte
};

// What only a DeepSpeed tag has: its ZeRO stage and the universal checkpoint it offers (universal/).
struct DeepSpeedTag {
  int zero_stage = 0;
  std::shared_ptr<const UniversalPlan> universal;  // null: no partitioned optimizer state to show
};

// A whole nested state dict served as one torch.save file (DCP: full_state.pt, what dcp_to_torch_save
// writes); its tensors are catalog::tensor_value handles.
struct StateFile {
  std::string path;  // relative to the tag's views: "full_state.pt", "full_state/optimizer_0.pt"
  pickle::ValuePtr value;
};

// A file of a derived view: text ckptfs wrote (hf/config.json built from the saved args), or a source file
// passed through (a tokenizer file, a config the user named).
struct WrittenText {
  std::string text;
};
struct PassedThrough {
  std::filesystem::path source;
};
struct ExtraFile {
  std::string path;  // relative to the tag's views: "hf/config.json"
  std::variant<WrittenText, PassedThrough> bytes;
};

struct Tag {
  std::string name;
  std::filesystem::path dir;
  std::string format;  // what the tag dir holds: "DeepSpeed checkpoint", "DeepSpeed universal checkpoint"
  Topology topology;
  // Weights by model folder ("": the root; verl's "critic") and view role (fp32 absent when the
  // checkpoint has no masters, hf only for Megatron-LM).
  std::map<std::string, std::map<ViewRole, CatalogPtr>, std::less<>> models;
  // Catalogs served as no view of their own, by name, apart from the roles: per-parameter optimizer state
  // ("exp_avg", "exp_avg_sq", ...) where partitioned, a whole saved state dict ("state", "state/<dir>").
  std::map<std::string, CatalogPtr, std::less<>> states;
  std::optional<DeepSpeedTag> deepspeed;  // DeepSpeed tags only
  std::vector<StateFile> state_files;
  // Regular files of the tag dir that are not checkpoint data (an HF Trainer step dir's config.json,
  // trainer_state.json), served beside the tag's views.
  std::vector<std::filesystem::path> side_files;
  std::vector<ExtraFile> extra_files;
  std::vector<std::filesystem::path> files;  // every checkpoint file of the tag
  std::vector<std::string> notes;            // deviations from the reference tools, for `inspect`

  // The catalog of `role` in model `folder`; throws std::out_of_range when the tag has none.
  const CatalogPtr& catalog(ViewRole role, std::string_view folder = "") const;
  bool has(ViewRole role, std::string_view folder = "") const;
  // Adds `catalog` as `role` of model `folder` unless the tag has one.
  void add(ViewRole role, CatalogPtr catalog, const std::string& folder = "");
  // Every catalog under the name inspect and ckptfs.json show ("model", "fp32", "hf" of the root,
  // "<folder>:<role>" of a further model, a state's name), sorted by that name.
  std::vector<std::pair<std::string, CatalogPtr>> named_catalogs() const;
  // The universal checkpoint the tag offers; null for every tag but a DeepSpeed one with a plan.
  std::shared_ptr<const UniversalPlan> universal() const {
    return deepspeed ? deepspeed->universal : nullptr;
  }
};

// A tag of the save dir that could not be read (an older broken step, a damaged universal dir beside a
// good tag): not served, its error shown by inspect, ckptfs.json and the mount's log.
struct LeftOutTag {
  std::string name;
  std::string error;  // the message the read failed with (it names the file)
};

struct Checkpoint {
  std::string framework;                          // "deepspeed", "dcp", "megatron", "torch"
  std::filesystem::path root;                     // the save dir (parent of the tags)
  std::string latest;                             // tag served at the mount root
  std::vector<Tag> tags;                          // sorted naturally (global_step9 before global_step10)
  std::vector<std::filesystem::path> side_files;  // regular files of the root that are not checkpoint data
  std::vector<LeftOutTag> left_out;               // tags other than `latest` that failed to read
  std::vector<std::string> in_progress;           // a refresh: tags whose save is not complete yet

  const Tag* find(const std::string& tag) const;
  const Tag& latest_tag() const;
};

struct OpenOptions {
  std::optional<std::string> tag;  // only open this tag (default: every tag)
  // Refuse the whole source when any tag fails to read (default: only the root tag must be valid; other
  // broken tags are left out, see Checkpoint::left_out).
  bool strict = false;
  // A live mount's refresh (docs/mount.md#live-runs): the tag already read under a name, to keep as read, or
  // null to read it again. Set, a tag it does not know is read only once its save is complete (its
  // framework's mark: the tracker names it or a later tag, HF Trainer's trainer_state.json); until then it
  // is in Checkpoint::in_progress, not served.
  std::function<const Tag*(const std::string& name)> known;
  // The wrapper prefix to strip from the model's names (-o strip_prefix=P); unset: found against
  // config.json's architecture where there is one (docs/formats/fsdp-per-rank.md#prefixes).
  std::optional<std::string> strip_prefix;
  // The model's config.json where none lies beside the checkpoint (-o config=FILE: an FSDP LOCAL_STATE_DICT
  // save of HF Trainer or accelerate has none); it names the architecture the model is cut and named by.
  std::optional<std::filesystem::path> model_config;
  // Where the transposed tensors it makes (GPT-2's Conv1D weights in hf/) keep their tiles: the command's
  // (the mount's -o transpose_cache_mb), shared by every copy of these options.
  std::shared_ptr<catalog::TransposeCache> transpose_cache = catalog::make_transpose_cache();
};

// `options` as a mount that follows a save dir opens it the first time (docs/mount.md#live-runs): complete
// saves only, none known yet. A mount of every tag does (unless -o static), and so does `ckptfs index`,
// whose index that mount loads.
inline OpenOptions complete_saves_only(OpenOptions options) {
  if (!options.tag) options.known = [](const std::string&) -> const Tag* { return nullptr; };
  return options;
}

// Detects the framework of `source` (its root: a save dir or one tag dir) and indexes it, reading it through
// `source`. The root may be spelt any way that names the directory (trailing slashes, `./`, `..`, symlinks):
// it is resolved first, so every spelling gives the same checkpoint. Throws SourceError when nothing readable
// is there, FormatError / UnsupportedError naming the file otherwise.
Checkpoint open_checkpoint(const io::Source& source, const OpenOptions& options = {});

}  // namespace ckptfs
