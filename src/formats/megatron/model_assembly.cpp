#include "formats/megatron/model_assembly.hpp"

#include <fmt/format.h>

#include <cstring>
#include <set>

#include "ckptfs/error.hpp"
#include "formats/megatron/split_rules.hpp"
#include "formats/megatron/state_names.hpp"

namespace ckptfs::megatron {

namespace {

bool is_tensor_entry(const std::pair<std::string, formats::Field>& entry) {
  return !is_extra_state(entry.first) && torch::as_tensor(entry.second.value()) != nullptr;
}

// Persistent buffers in a model state dict: served, but no optimizer holds them.
bool is_buffer(std::string_view name) {
  return name.ends_with("router.expert_bias");
}

bool ends_with_module(std::string_view name, std::string_view suffix) {
  return name == suffix || (name.ends_with(suffix) && name[name.size() - suffix.size() - 1] == '.');
}

}  // namespace

void ChunkedModel::add_chunk(ModelChunk chunk) {
  chunk.by_name.clear();
  for (const auto& ep : chunk.ranks) {
    auto& maps = chunk.by_name.emplace_back();
    for (const FlatState* state : ep) {
      auto& map = maps.emplace_back();
      map.reserve(state->size());
      for (const auto& [name, field] : *state) map[name] = &field;  // the last entry wins, as in a dict
    }
  }
  std::set<int64_t> layers;
  const FlatState& base = *chunk.ranks.front().front();
  for (const auto& [name, field] : base)
    if (auto layer = parse_layer_name(name)) layers.insert(layer->index);
  const int64_t count = layers.empty() ? 0 : *layers.rbegin() + 1;
  if (static_cast<int64_t>(layers.size()) != count)
    throw FormatError(fmt::format("{}: model chunk {} holds layers with gaps (local numbers 0..{} expected)",
                                  chunk.file_of(0, 0).string(), chunk.vp, count - 1));
  const int64_t offset = layers_;
  layers_ += count;
  const size_t index = chunks_.size();
  const int ep_ranks = static_cast<int>(chunk.ranks.size());
  const int64_t experts_per_rank = args_.num_experts / ep_ranks;
  // Routed experts come in runs (one layer's experts); each EP rank holds its own, numbered from 0: the
  // run is served once per EP rank, renumbered to global expert ids.
  std::vector<std::string> run;
  const auto flush_run = [&] {
    for (int ep = 0; ep < ep_ranks; ++ep)
      for (const auto& local : run)
        served_.push_back(
            {index, ep, local, shift_expert(shift_layer(local, offset), ep * experts_per_rank)});
    run.clear();
  };
  for (const auto& entry : base) {
    if (!is_tensor_entry(entry) || is_tied_copy(chunk, entry.first)) continue;
    if (is_expert(entry.first)) {
      run.push_back(entry.first);
      continue;
    }
    flush_run();
    served_.push_back({index, 0, entry.first, shift_layer(entry.first, offset)});
  }
  flush_run();
  chunks_.push_back(std::move(chunk));
}

bool ChunkedModel::is_tied_copy(const ModelChunk& chunk, const std::string& name) const {
  // The last stage's synchronised copy of the tied embedding (core: output_layer, legacy:
  // word_embeddings_for_head); a TP=1 PP=1 model has only the first stage's.
  const bool first_chunk = chunk.pp == 0 && chunk.vp == 0;
  return args_.tied_embeddings && !first_chunk &&
         (ends_with_module(name, "output_layer.weight") ||
          ends_with_module(name, "word_embeddings_for_head.weight"));
}

std::shared_ptr<catalog::Catalog> ChunkedModel::merge_model() {
  if (layers_ != args_.num_layers)
    throw FormatError(fmt::format("{}: the rank files hold {} layers, the saved args say num_layers {}",
                                  chunks_.front().file_of(0, 0).parent_path().parent_path().string(), layers_,
                                  args_.num_layers));
  auto out = std::make_shared<catalog::Catalog>();
  for (const Served& s : served_) {
    const auto ranks = rank_tensors(s);
    out->tensors.push_back(formats::merge_tensor_parallel(s.name, split_of(s.local_name, args_), ranks,
                                                          ranks.front().tensor.dtype, &notes_, s.name));
  }
  check_against_args(*out, args_, chunks_.front().file_of(0, 0).string());
  return out;
}

std::vector<RankTensor> ChunkedModel::rank_tensors(const Served& s) const {
  const ModelChunk& chunk = chunks_[s.chunk];
  std::vector<RankTensor> ranks;
  for (size_t tp = 0; tp < chunk.ranks[s.ep].size(); ++tp) {
    const auto& names = chunk.by_name[s.ep][tp];
    const auto it = names.find(s.local_name);
    const formats::Field* f = it == names.end() ? nullptr : it->second;
    if (f == nullptr || torch::as_tensor(f->value()) == nullptr)
      throw FormatError(fmt::format("{}: tensor {} is missing (TP rank 0 of EP rank 0 has it)",
                                    chunk.file_of(s.ep, tp).string(), s.local_name));
    ranks.push_back(formats::rank_tensor(*torch::as_tensor(f->value()), chunk.file_of(s.ep, tp)));
  }
  return ranks;
}

void check_against_args(const catalog::Catalog& model, const ModelArgs& args, const std::string& where) {
  const int64_t qkv_rows = (args.heads + 2 * args.query_groups) * args.kv_channels;
  const int64_t fc1_rows = (args.swiglu ? 2 : 1) * args.ffn_hidden;
  for (const auto& t : model.tensors) {
    const auto expect = [&](int64_t rows, const char* what) {
      if (t.shape.empty() || t.shape[0] != rows)
        throw FormatError(
            fmt::format("{}: tensor {} has {} rows merged over TP {}, the saved args give {} ({})", where,
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

std::vector<ParamSlot> ChunkedModel::params_of(int pp, int ep, int tp) const {
  std::vector<ParamSlot> out;
  const bool tied_across_stages = args_.tied_embeddings && args_.pp > 1;
  // named_parameters() walks the rank's chunks in order (model0, model1, ...).
  for (const auto& chunk : chunks_) {
    if (chunk.pp != pp) continue;
    for (const auto& entry : *chunk.ranks[ep][tp]) {
      if (!is_tensor_entry(entry) || is_buffer(entry.first)) continue;
      const std::string& name = entry.first;
      const bool shared =
          tied_across_stages &&
          ((pp == 0 && ends_with_module(name, "word_embeddings.weight")) ||
           (pp == args_.pp - 1 && (ends_with_module(name, "output_layer.weight") ||
                                   ends_with_module(name, "word_embeddings_for_head.weight"))));
      out.push_back({chunk.vp, name, torch::as_tensor(entry.second.value())->shape, shared, is_expert(name)});
    }
  }
  return out;
}

std::shared_ptr<catalog::Catalog> ChunkedModel::merge_masters(const Masters& masters) const {
  // (pp, ep, tp, vp, local name) -> master
  std::map<std::tuple<int, int, int, size_t, std::string>, const torch::SourceTensor*> lookup;
  for (int pp = 0; pp < args_.pp; ++pp)
    for (int ep = 0; ep < static_cast<int>(masters[pp].size()); ++ep)
      for (int tp = 0; tp < args_.tp; ++tp) {
        const auto params = params_of(pp, ep, tp);
        for (size_t i = 0; i < params.size(); ++i)
          lookup[{pp, ep, tp, params[i].chunk, params[i].name}] = &masters[pp][ep][tp][i];
      }
  auto out = std::make_shared<catalog::Catalog>();
  for (const Served& s : served_) {
    const ModelChunk& chunk = chunks_[s.chunk];
    std::vector<RankTensor> ranks = rank_tensors(s);  // a buffer's own (float32) copy
    if (!is_buffer(s.local_name))
      for (int tp = 0; tp < args_.tp; ++tp)
        ranks[tp].tensor = *lookup.at({chunk.pp, s.ep, tp, chunk.vp, s.local_name});
    out->tensors.push_back(formats::merge_tensor_parallel(s.name, split_of(s.local_name, args_), ranks,
                                                          DType::F32, nullptr, s.name));
  }
  return out;
}

}  // namespace ckptfs::megatron
