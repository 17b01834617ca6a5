#include "views/gguf/gguf_view.hpp"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <functional>

#include "views/gguf/gguf_file.hpp"
#include "views/gguf/gguf_gpt2.hpp"
#include "views/gguf/gguf_kv.hpp"
#include "views/gguf/gguf_llama.hpp"
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

// The directory the converter is given is named `hf`: general.name "Hf", nothing else derived from it.
constexpr std::string_view kModelName = "Hf";

// generation_config.json's fields that the converter writes as general.sampling.* (gguf-py metadata.py).
constexpr std::array kSamplingFields = {
    "sequence",      "top_k",        "top_p",          "min_p",          "xtc_probability",
    "xtc_threshold", "temperature",  "penalty_last_n", "penalty_repeat", "repetition_penalty",
    "mirostat",      "mirostat_tau", "mirostat_eta"};

// gguf-py's model_weight_count_rounded_notation(total, min_digits=2): "6.7M", "17M", "3.3B".
std::string size_label(uint64_t total) {
  const auto n = static_cast<double>(total);
  double scaled = n * 1e-3;
  char suffix = 'K';
  if (n > 1e12)
    scaled = n * 1e-12, suffix = 'T';
  else if (n > 1e9)
    scaled = n * 1e-9, suffix = 'B';
  else if (n > 1e6)
    scaled = n * 1e-6, suffix = 'M';
  const std::string digits =
      fmt::format("{}", static_cast<uint64_t>(std::nearbyint(scaled)));  // half to even
  const size_t significant = digits == "0" ? 0 : digits.size();
  const int fix = std::max(2 - static_cast<int>(significant), 0);
  return fmt::format("{:.{}f}{}", scaled, fix, suffix);
}

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

// What an architecture adds to the converter's common steps.
struct Architecture {
  std::string_view name;          // general.architecture
  bool add_space_prefix = false;  // Llama's set_vocab writes tokenizer_config.json's add_prefix_space first
  bool own_tokenizer_class = false;  // transformers loads its own tokenizer class whatever the files say
  std::function<void(KvList&, uint32_t file_type)> add_parameters;  // general.file_type placed among them
  std::function<std::vector<GgufTensor>(GgmlType)> tensors;
};

Architecture architecture_of(const std::string& arch, const json& config,
                             const std::shared_ptr<const catalog::Catalog>& hf) {
  if (arch == "LlamaForCausalLM" || arch == "Qwen2ForCausalLM") {
    const Family family = arch == "LlamaForCausalLM" ? Family::llama : Family::qwen2;
    const LlamaConfig c = read_llama_config(config, family);
    return {architecture_name(family), family == Family::llama, family == Family::qwen2,
            [c](KvList& kv, uint32_t file_type) { add_llama_parameters(kv, c, file_type); },
            [c, hf](GgmlType type) { return llama_tensors(hf, c, type); }};
  }
  if (arch == "GPT2LMHeadModel") {
    const Gpt2Config c = read_gpt2_config(config);
    return {"gpt2", false, false,
            [c](KvList& kv, uint32_t file_type) { add_gpt2_parameters(kv, c, file_type); },
            [hf](GgmlType type) { return gpt2_tensors(hf, type); }};
  }
  throw Refusal(fmt::format(
      "architecture {} not served yet (LlamaForCausalLM, Qwen2ForCausalLM and GPT2LMHeadModel are)", arch));
}

// tokenizer.ggml.pre found as the converter finds it, where transformers' AutoTokenizer loads tokenizer.json
// as it is (TokenizersBackend): tokenizer_config.json's tokenizer_class TokenizersBackend or
// PreTrainedTokenizerFast. Without one it loads the model type's class (LlamaTokenizer, GPT2Tokenizer), and
// for a qwen2 model Qwen2Tokenizer whatever it says, whose own pre-tokenizer replaces the file's.
std::string pre_tokenizer_name(const Architecture& arch, const HfDirectory& dir, const json& tokenizer) {
  if (arch.own_tokenizer_class)
    throw Refusal(
        "transformers loads Qwen2Tokenizer for a qwen2 model, whose pre-tokenizer (Qwen2's Split regex) "
        "ckptfs does not encode yet; -o gguf_pre=NAME names it (qwen2 for Qwen's tokenizer)");
  const json tokenizer_config = dir.json("tokenizer_config.json").value_or(json::object());
  const json tokenizer_class = tokenizer_config.value("tokenizer_class", json());
  if (tokenizer_class != "TokenizersBackend" && tokenizer_class != "PreTrainedTokenizerFast")
    throw Refusal(
        fmt::format("tokenizer_config.json: tokenizer_class {}: transformers loads a tokenizer class "
                    "that may replace tokenizer.json's pre-tokenizer; -o gguf_pre=NAME names it",
                    tokenizer_class.dump()));
  return identify_pre_tokenizer(tokenizer);
}

VirtualFilePtr model_file(const Architecture& arch, const OutputType& out, const KvList& tokenizer,
                          const std::shared_ptr<const std::string>& tokenizer_bytes, std::string& file_name) {
  auto tensors = arch.tensors(out.type);
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.numel();
  const std::string label = size_label(total);
  KvList kv;
  kv.add_string("general.architecture", arch.name);
  kv.add_string("general.type", "model");
  kv.add_string("general.name", kModelName);
  kv.add_string("general.size_label", label);
  arch.add_parameters(kv, out.file_type);
  kv.add_u32("general.quantization_version", 2);
  file_name = fmt::format("{}-{}-{}.gguf", kModelName, label, out.name);
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

GgufViews make_gguf_views(const std::shared_ptr<const catalog::Catalog>& hf, const HfDirectory& dir,
                          const std::optional<std::string>& pre) {
  GgufViews out;
  try {
    const auto config = dir.json("config.json");
    if (!config || !config->is_object()) throw Refusal("no config.json");
    const json archs = config->value("architectures", json());
    if (!archs.is_array() || archs.empty() || !archs[0].is_string())
      throw Refusal("config.json names no architecture (the converter: Failed to detect model architecture)");
    const Architecture arch = architecture_of(archs[0].get<std::string>(), *config, hf);
    check_directory(dir, *config);
    const auto tokenizer_json = dir.json("tokenizer.json");
    if (!tokenizer_json) throw Refusal("no tokenizer.json");
    const std::string pre_name = pre ? *pre : pre_tokenizer_name(arch, dir, *tokenizer_json);
    const KvList tokenizer = tokenizer_keys(arch, dir, *tokenizer_json, *config, pre_name);
    const auto tokenizer_bytes = std::make_shared<const std::string>(tokenizer.encode());
    for (const auto& type : kOutputTypes) {
      std::string name;
      auto file = model_file(arch, type, tokenizer, tokenizer_bytes, name);
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
