// A Megatron-LM model held as model chunks (one per pipeline stage and virtual chunk, in VP-major order)
// of tensor- and expert-parallel rank state dicts, merged into the TP=1 PP=1 EP=1 model: global layer
// and expert numbers, tensors merged over TP ranks, tied-embedding copies left out.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "formats/megatron/fp32_masters.hpp"
#include "formats/megatron/model_args.hpp"
#include "formats/megatron/split_rules.hpp"
#include "formats/pickle_access.hpp"

namespace ckptfs::megatron {

using formats::RankTensor;

using FlatState = std::vector<std::pair<std::string, formats::Field>>;

struct ModelChunk {
  int pp = 0;
  size_t vp = 0;
  std::vector<std::vector<const FlatState*>> ranks;  // [ep rank][tp rank]
  std::function<std::filesystem::path(size_t ep, size_t tp)> file_of;
  // ranks' entries by name (filled by ChunkedModel::add_chunk): a lookup per merged tensor, not a scan
  std::vector<std::vector<std::unordered_map<std::string_view, const formats::Field*>>> by_name;
};

// Throws FormatError naming `where` when a merged tensor's rows contradict the saved args (padded vocab,
// QKV rows from heads, query groups and kv_channels, fc1 rows from ffn_hidden_size).
void check_against_args(const catalog::Catalog& model, const ModelArgs& args, const std::string& where);

class ChunkedModel {
 public:
  explicit ChunkedModel(ModelArgs args) : args_(std::move(args)) {}

  // Chunks must come in VP-major order (v = 0 for every stage, then v = 1, ...): the order of their
  // layers in the whole model.
  void add_chunk(ModelChunk chunk);

  // The merged model weights (and persistent buffers), named as Megatron names them at TP=1 PP=1 EP=1.
  // Throws FormatError naming the file when ranks disagree or the tensors contradict the saved args.
  std::shared_ptr<catalog::Catalog> merge_model();

  // The trainable parameters of the rank file of (pp, ep, tp), chunk by chunk, as its optimizer lists them.
  std::vector<ParamSlot> params_of(int pp, int ep, int tp) const;

  // The fp32 masters merged like the weights; masters[pp][ep][tp] is aligned with params_of(pp, ep, tp).
  // Buffers (no master) are served from the model's own float32 copy.
  using Masters = std::vector<std::vector<std::vector<std::vector<torch::SourceTensor>>>>;
  std::shared_ptr<catalog::Catalog> merge_masters(const Masters& masters) const;

  const std::vector<std::string>& notes() const { return notes_; }

 private:
  struct Served {  // one tensor of the merged model
    size_t chunk;
    int ep;                  // the expert-parallel rank holding it (0 for dense tensors)
    std::string local_name;  // as the rank files name it
    std::string name;        // global layer and expert numbers
  };
  bool is_tied_copy(const ModelChunk& chunk, const std::string& name) const;
  std::vector<RankTensor> rank_tensors(const Served& s) const;

  ModelArgs args_;
  std::vector<ModelChunk> chunks_;
  int64_t layers_ = 0;
  std::vector<Served> served_;
  std::vector<std::string> notes_;
};

}  // namespace ckptfs::megatron
