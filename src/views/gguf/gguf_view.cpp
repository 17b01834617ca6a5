#include "views/gguf/gguf_view.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <functional>

#include "views/gguf/converted_tensor.hpp"
#include "views/gguf/gguf_file.hpp"
#include "views/gguf/gguf_gpt2.hpp"
#include "views/gguf/gguf_kv.hpp"
#include "views/gguf/gguf_llama.hpp"
#include "views/gguf/gguf_naming.hpp"
#include "views/gguf/gguf_tokenizer.hpp"
#include "views/gguf/pre_tokenizer.hpp"

namespace ckptfs::views::gguf {

namespace {

using nlohmann::json;

struct OutputType {
  GgmlType type;
  uint32_t file_type;     // LlamaFileType (general.file_type)
  std::string_view name;  // in the file name, as the converter writes --outtype
};
constexpr std::array kOutputTypes = {OutputType{GgmlType::f32, 0, "F32"}, OutputType{GgmlType::f16, 1, "F16"},
                                     OutputType{GgmlType::bf16, 32, "BF16"},
                                     OutputType{GgmlType::q8_0, 7, "Q8_0"}};

// generation_config.json's fields that the converter writes as general.sampling.* (gguf-py metadata.py).
constexpr std::array kSamplingFields = {
    "sequence",      "top_k",        "top_p",          "min_p",          "xtc_probability",
    "xtc_threshold", "temperature",  "penalty_last_n", "penalty_repeat", "repetition_penalty",
    "mirostat",      "mirostat_tau", "mirostat_eta"};

// The refusals that do not depend on the architecture: files and fields that change general.*.
void check_directory(const HfDirectory& dir, const json& config) {
  if (config.contains("_name_or_path")) throw Refusal("config.json: _name_or_path changes general.name");
  if (const auto gen = dir.json("generation_config.json"))
    for (const char* field : kSamplingFields)
      if (gen->contains(field))
        throw Refusal(
            fmt::format("generation_config.json: {} (general.sampling.*) not followed by ckptfs yet", field));
  for (const char* name :
       {"modules.json", "embedding_config.json", "hf_quant_config.json", "hadamard_packing.json"})
    if (dir.has(name)) throw Refusal(fmt::format("{} present: not followed by ckptfs yet", name));
}

// Qwen3Model's _is_qwen3_reranker by the directory's name.
bool is_reranker_name(std::string_view directory) {
  std::string lower(directory);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](char c) { return std::tolower(c); });
  return lower.find("qwen3-reranker") != std::string::npos ||
         lower.find("qwen3-vl-reranker") != std::string::npos;
}

// What an architecture adds to the converter's common steps.
struct Architecture {
  std::string_view name;          // general.architecture
  bool add_space_prefix = false;  // Llama's set_vocab writes tokenizer_config.json's add_prefix_space first
  bool own_tokenizer_class = false;  // transformers loads its own tokenizer class whatever the files say
  std::function<void(KvList&, uint32_t file_type)> add_parameters;  // general.file_type placed among them
  std::function<std::vector<GgufTensor>(GgmlType)> tensors;
};

// The converter's model classes ckptfs follows, by config.json's architectures[0].
constexpr std::array<std::pair<std::string_view, Family>, 5> kLlamaLike = {
    {{"LlamaForCausalLM", Family::llama},
     {"MixtralForCausalLM", Family::mixtral},
     {"Qwen2ForCausalLM", Family::qwen2},
     {"Qwen3ForCausalLM", Family::qwen3},
     {"Qwen3MoeForCausalLM", Family::qwen3_moe}}};

Architecture architecture_of(const std::string& arch, const json& config,
                             const std::shared_ptr<const catalog::Catalog>& hf, std::vector<size_t> order,
                             const std::shared_ptr<catalog::TransposeCache>& transpose_cache) {
  for (const auto& [class_name, family] : kLlamaLike) {
    if (arch != class_name) continue;
    const LlamaConfig c = read_llama_config(config, family);
    // transformers loads Qwen2Tokenizer for the Qwen families (tokenization_auto.py)
    const bool qwen = family == Family::qwen2 || family == Family::qwen3 || family == Family::qwen3_moe;
    return {architecture_name(family), family == Family::llama || family == Family::mixtral, qwen,
            [c](KvList& kv, uint32_t file_type) { add_llama_parameters(kv, c, file_type); },
            [c, hf, order](GgmlType type) { return llama_tensors(hf, order, c, type); }};
  }
  if (arch == "GPT2LMHeadModel") {
    const Gpt2Config c = read_gpt2_config(config);
    return {"gpt2", false, false,
            [c](KvList& kv, uint32_t file_type) { add_gpt2_parameters(kv, c, file_type); },
            [hf, order, transpose_cache](GgmlType type) {
              return gpt2_tensors(hf, order, type, transpose_cache);
            }};
  }
  throw Refusal(
      fmt::format("architecture {} not served yet (LlamaForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, "
                  "Qwen3ForCausalLM, Qwen3MoeForCausalLM and GPT2LMHeadModel are)",
                  arch));
}

// gguf-py's GGUFWriter.get_total_parameter_count over the tensor infos.
ParameterCount count_parameters(const std::vector<GgufTensor>& tensors) {
  ParameterCount count;
  uint64_t expert_sum = 0, expert_tensors = 0;
  for (const auto& t : tensors) {
    const uint64_t n = t.numel();
    count.total += n;
    if (t.name.find("_exps.") != std::string::npos && t.ne.size() >= 3) {
      const uint64_t experts =
          t.ne[t.name.find(".bias") != std::string::npos ? 1 : 2];  // numpy's [-2] / [-3]
      count.expert += n / experts;
      expert_sum += experts;
      ++expert_tensors;
    } else {
      count.shared += n;
    }
  }
  count.expert_count = expert_tensors > 0 ? expert_sum / expert_tensors : 0;
  return count;
}

// tokenizer.ggml.pre found as the converter finds it, where transformers' AutoTokenizer loads tokenizer.json
// as it is (TokenizersBackend): tokenizer_config.json's tokenizer_class TokenizersBackend or
// PreTrainedTokenizerFast. Without one it loads the model type's class (LlamaTokenizer, GPT2Tokenizer), and
// for a qwen2 model Qwen2Tokenizer whatever it says, whose own normalizer and pre-tokenizer replace the
// file's (encoded too).
std::string pre_tokenizer_name(const Architecture& arch, const HfDirectory& dir, const json& tokenizer) {
  const json tokenizer_config = dir.json("tokenizer_config.json").value_or(json::object());
  if (arch.own_tokenizer_class)
    return identify_pre_tokenizer(tokenizer, tokenizer_config, TokenizerClass::qwen2);
  const json tokenizer_class = tokenizer_config.value("tokenizer_class", json());
  if (tokenizer_class != "TokenizersBackend" && tokenizer_class != "PreTrainedTokenizerFast")
    throw Refusal(
        fmt::format("tokenizer_config.json: tokenizer_class {}: transformers loads a tokenizer class "
                    "that may replace tokenizer.json's pre-tokenizer; -o gguf_pre=NAME names it",
                    tokenizer_class.dump()));
  return identify_pre_tokenizer(tokenizer, tokenizer_config, TokenizerClass::backend);
}

VirtualFilePtr model_file(const Architecture& arch, const OutputType& out, std::string_view directory,
                          const KvList& tokenizer, const std::shared_ptr<const std::string>& tokenizer_bytes,
                          std::string& file_name) {
  auto tensors = arch.tensors(out.type);
  const ModelNaming naming = name_model(directory, count_parameters(tensors));
  KvList kv;
  kv.add_string("general.architecture", arch.name);
  kv.add_string("general.type", "model");
  add_naming(kv, naming);
  arch.add_parameters(kv, out.file_type);
  kv.add_u32("general.quantization_version", 2);
  file_name = gguf_file_name(naming, out.name);
  return make_gguf_file(kv.encode(), tokenizer_bytes, kv.size() + tokenizer.size(), std::move(tensors));
}

// set_vocab's keys: Llama's add_space_prefix, then the byte-level BPE ones.
KvList tokenizer_keys(const Architecture& arch, const HfDirectory& dir, const json& tokenizer,
                      const json& config, const std::string& pre) {
  KvList kv;
  const json tokenizer_config = dir.json("tokenizer_config.json").value_or(json::object());
  if (const json prefix = tokenizer_config.value("add_prefix_space", json());
      arch.add_space_prefix && prefix.is_boolean())
    kv.add_bool("tokenizer.ggml.add_space_prefix", prefix.get<bool>());
  add_bpe_tokenizer(kv, dir, tokenizer, config, pre);
  return kv;
}

}  // namespace

GgufViews make_gguf_views(const std::shared_ptr<const catalog::Catalog>& hf,
                          const std::vector<std::vector<size_t>>& shards, const HfDirectory& dir,
                          const GgufChoices& choices) {
  GgufViews out;
  try {
    if (!valid_directory_name(choices.directory))
      throw Refusal(
          fmt::format("directory name '{}' not followed by ckptfs (ASCII letters, digits, '.', "
                      "'_', '-')",
                      choices.directory));
    const auto config = dir.json("config.json");
    if (!config || !config->is_object()) throw Refusal("no config.json");
    const json archs = config->value("architectures", json());
    if (!archs.is_array() || archs.empty() || !archs[0].is_string())
      throw Refusal("config.json names no architecture (the converter: Failed to detect model architecture)");
    const std::string arch_name = archs[0].get<std::string>();
    const Architecture arch =
        architecture_of(arch_name, *config, hf, converter_order(*hf, shards), choices.transpose_cache);
    if (arch_name == "Qwen3ForCausalLM" && is_reranker_name(choices.directory))
      throw Refusal("a directory named like a Qwen3 reranker: the converter writes a reranker");
    check_directory(dir, *config);
    arch.tensors(GgmlType::f32);  // the converter maps the tensors before it reads the tokenizer
    const auto tokenizer_json = dir.json("tokenizer.json");
    if (!tokenizer_json) throw Refusal("no tokenizer.json");
    const std::string pre_name = choices.pre ? *choices.pre : pre_tokenizer_name(arch, dir, *tokenizer_json);
    const KvList tokenizer = tokenizer_keys(arch, dir, *tokenizer_json, *config, pre_name);
    const auto tokenizer_bytes = std::make_shared<const std::string>(tokenizer.encode());
    for (const auto& type : kOutputTypes) {
      std::string name;
      auto file = model_file(arch, type, choices.directory, tokenizer, tokenizer_bytes, name);
      out.files.push_back({std::move(name), std::move(file)});
    }
  } catch (const Refusal& e) {
    out.files.clear();
    out.refusal = e.what();
  } catch (const json::exception& e) {  // a field of another JSON type than the converter reads
    out.files.clear();
    out.refusal = fmt::format("a field of the model's JSON files has an unexpected type: {}", e.what());
  }
  return out;
}

}  // namespace ckptfs::views::gguf
