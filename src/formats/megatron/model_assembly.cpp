#include "formats/megatron/model_assembly.hpp"

#include <fmt/format.h>

#include <cstring>
#include <set>

#include "ckptfs/error.hpp"
#include "formats/megatron/state_names.hpp"
#include "formats/megatron/tensor_parallel.hpp"

namespace ckptfs::megatron {

namespace {

constexpr uint64_t kMaxReplicaCompareBytes = 1 << 20;  // norms and biases; never a weight matrix

bool is_param(const std::pair<std::string, formats::Field>& entry) {
  return !is_extra_state(entry.first) && torch::as_tensor(entry.second.value()) != nullptr;
}

bool ends_with_module(std::string_view name, std::string_view suffix) {
  return name == suffix || (name.ends_with(suffix) && name[name.size() - suffix.size() - 1] == '.');
}

const formats::Field* find_entry(const FlatState& state, const std::string& name) {
  for (const auto& [n, f] : state)
    if (n == name) return &f;
  return nullptr;
}

std::vector<std::byte> tensor_bytes(const torch::SourceTensor& src, const std::string& name) {
  const auto t = catalog::whole_tensor(name, src, src.dtype, "");
  std::vector<std::byte> out(t.nbytes());
  catalog::read_tensor(t, 0, out);
  return out;
}

}  // namespace

void ChunkedModel::add_chunk(ModelChunk chunk, size_t vp) {
  std::set<int64_t> layers;
  for (const auto& [name, field] : *chunk.ranks.front())
    if (auto layer = parse_layer_name(name)) layers.insert(layer->index);
  const int64_t count = layers.empty() ? 0 : *layers.rbegin() + 1;
  if (static_cast<int64_t>(layers.size()) != count)
    throw FormatError(fmt::format("{}: model chunk {} holds layers with gaps (local numbers 0..{} expected)",
                                  chunk.file_of(0).string(), chunk.vp, count - 1));
  layer_offsets_.push_back(layers_);
  layers_ += count;
  const size_t index = chunks_.size();
  for (const auto& entry : *chunk.ranks.front())
    if (is_param(entry) && !is_tied_copy(chunk, entry.first))
      served_.push_back({index, entry.first, shift_layer(entry.first, layer_offsets_.back())});
  chunks_.push_back(std::move(chunk));
  (void)vp;
}

bool ChunkedModel::is_tied_copy(const ModelChunk& chunk, const std::string& name) const {
  // The last stage's synchronised copy of the tied embedding (core: output_layer, legacy:
  // word_embeddings_for_head); a TP=1 PP=1 model has only the first stage's.
  const bool first_chunk = chunk.pp == 0 && chunk.vp == 0;
  return args_.tied_embeddings && !first_chunk &&
         (ends_with_module(name, "output_layer.weight") || ends_with_module(name, "word_embeddings_for_head.weight"));
}

void ChunkedModel::compare_replicas(const std::string& name, const std::vector<RankTensor>& ranks) {
  const auto& first = *ranks.front().tensor;
  if (ranks.size() < 2 || first.numel() * dtype_size(first.dtype) > kMaxReplicaCompareBytes) return;
  const auto reference = tensor_bytes(first, name);
  for (size_t r = 1; r < ranks.size(); ++r)
    if (tensor_bytes(*ranks[r].tensor, name) != reference) {
      notes_.push_back(fmt::format("{} is replicated over TP ranks but differs between {} and {}: TP rank 0's copy "
                                   "is served",
                                   name, ranks.front().file.string(), ranks[r].file.string()));
      return;
    }
}

std::shared_ptr<catalog::Catalog> ChunkedModel::merge_model() {
  if (layers_ != args_.num_layers)
    throw FormatError(fmt::format("{}: the rank files hold {} layers, the saved args say num_layers {}",
                                  chunks_.front().file_of(0).parent_path().parent_path().string(), layers_,
                                  args_.num_layers));
  auto out = std::make_shared<catalog::Catalog>();
  for (const Served& s : served_) {
    const ModelChunk& chunk = chunks_[s.chunk];
    std::vector<RankTensor> ranks;
    for (size_t tp = 0; tp < chunk.ranks.size(); ++tp) {
      const formats::Field* f = find_entry(*chunk.ranks[tp], s.local_name);
      if (f == nullptr || torch::as_tensor(f->value()) == nullptr)
        throw FormatError(fmt::format("{}: tensor {} is missing (TP rank 0 has it)", chunk.file_of(tp).string(), s.local_name));
      ranks.push_back({torch::as_tensor(f->value()), chunk.file_of(tp)});
    }
    const Split split = split_of(s.local_name, args_);
    if (split == Split::Replicated) compare_replicas(s.name, ranks);
    out->tensors.push_back(merge_tensor_parallel(s.name, split, ranks, ranks.front().tensor->dtype));
  }
  check_against_args(*out, args_, chunks_.front().file_of(0).string());
  return out;
}

void check_against_args(const catalog::Catalog& model, const ModelArgs& args, const std::string& where) {
  const int64_t qkv_rows = (args.heads + 2 * args.query_groups) * args.kv_channels;
  const int64_t fc1_rows = (args.swiglu ? 2 : 1) * args.ffn_hidden;
  for (const auto& t : model.tensors) {
    const auto expect = [&](int64_t rows, const char* what) {
      if (t.shape.empty() || t.shape[0] != rows)
        throw FormatError(fmt::format("{}: tensor {} has {} rows merged over TP {}, the saved args give {} ({})", where,
                                      t.name, t.shape.empty() ? 0 : t.shape[0], args.tp, rows, what));
    };
    if (ends_with_module(t.name, "word_embeddings.weight") || ends_with_module(t.name, "output_layer.weight"))
      expect(args.padded_vocab, "padded_vocab_size");
    else if (t.name.ends_with("linear_qkv.weight") || t.name.ends_with("query_key_value.weight"))
      expect(qkv_rows, "(heads + 2 x query groups) x kv_channels");
    else if ((t.name.ends_with("linear_fc1.weight") || t.name.ends_with("dense_h_to_4h.weight")) &&
             t.name.find("experts") == std::string::npos)
      expect(fc1_rows, args.swiglu ? "2 x ffn_hidden_size (SwiGLU)" : "ffn_hidden_size");
  }
}

std::vector<ParamSlot> ChunkedModel::params_of(int pp, int tp) const {
  std::vector<ParamSlot> out;
  const bool tied_across_stages = args_.tied_embeddings && args_.pp > 1;
  // named_parameters() walks the rank's chunks in order (model0, model1, ...).
  for (const auto& chunk : chunks_) {
    if (chunk.pp != pp) continue;
    for (const auto& entry : *chunk.ranks[tp]) {
      if (!is_param(entry)) continue;
      const auto* t = torch::as_tensor(entry.second.value());
      const bool shared = tied_across_stages && ((pp == 0 && ends_with_module(entry.first, "word_embeddings.weight")) ||
                                                 (pp == args_.pp - 1 && (ends_with_module(entry.first, "output_layer.weight") ||
                                                                         ends_with_module(entry.first, "word_embeddings_for_head.weight"))));
      out.push_back({chunk.vp, entry.first, t->shape, shared});
    }
  }
  return out;
}

std::shared_ptr<catalog::Catalog> ChunkedModel::merge_masters(
    const std::vector<std::vector<std::vector<torch::SourceTensor>>>& masters) const {
  // (pp, tp, vp, local name) -> master
  std::map<std::tuple<int, int, size_t, std::string>, const torch::SourceTensor*> lookup;
  for (int pp = 0; pp < args_.pp; ++pp)
    for (int tp = 0; tp < args_.tp; ++tp) {
      const auto params = params_of(pp, tp);
      for (size_t i = 0; i < params.size(); ++i) lookup[{pp, tp, params[i].chunk, params[i].name}] = &masters[pp][tp][i];
    }
  auto out = std::make_shared<catalog::Catalog>();
  for (const Served& s : served_) {
    const ModelChunk& chunk = chunks_[s.chunk];
    std::vector<RankTensor> ranks;
    for (int tp = 0; tp < args_.tp; ++tp)
      ranks.push_back({lookup.at({chunk.pp, tp, chunk.vp, s.local_name}), chunk.file_of(tp)});
    out->tensors.push_back(merge_tensor_parallel(s.name, split_of(s.local_name, args_), ranks, DType::F32));
  }
  return out;
}

}  // namespace ckptfs::megatron
