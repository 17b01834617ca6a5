"""Runs inside the Debian unstable chroot (torch, transformers 5.x, tokenizers): writes a small Hugging Face
model directory with save_pretrained and a real published tokenizer, for the gguf/ view's tests.

    python3 make_hf_dir.py CASE.json OUT_DIR

CASE: {"arch": "llama" | "qwen2" | "qwen3" | "qwen3_moe" | "mixtral" | "gpt2", "dtype": "bfloat16" | "float16" |
"float32", "layers", "hidden", "heads", "seed", for all but gpt2 "intermediate", "kv_heads", "tied", optionally
"rope_scaling" (transformers' rope dict) and "config" (more config class arguments: "head_dim",
"num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "mlp_only_layers"...); "tokenizer": the folder of the GPT-2 vocabulary (encoder.json.xz, vocab.bpe.xz), or
"tokenizer_files": a folder of tokenizer.json.xz and tokenizer_config.json.xz copied as they are (then
"vocab_size" and "eos_token_id" too, and optionally "tokenizer_edit": a name in TOKENIZER_EDITS)}. OUT_DIR gets config.json,
generation_config.json, model.safetensors, tokenizer.json and tokenizer_config.json.
"""
import json
import lzma
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors  # noqa: E402
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,  # noqa: E402
                          MixtralConfig, MixtralForCausalLM, PreTrainedTokenizerFast, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

ARCHS = {"llama": (LlamaConfig, LlamaForCausalLM, "LlamaForCausalLM"),
         "qwen2": (Qwen2Config, Qwen2ForCausalLM, "Qwen2ForCausalLM"),
         "qwen3": (Qwen3Config, Qwen3ForCausalLM, "Qwen3ForCausalLM"),
         "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, "Qwen3MoeForCausalLM"),
         "mixtral": (MixtralConfig, MixtralForCausalLM, "MixtralForCausalLM")}

EOT = "<|endoftext|>"


def gpt2_tokenizer(folder):
    """GPT-2's tokenizer as its published vocab.json / merges.txt define it (byte-level, no prefix space)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name in ("encoder.json", "vocab.bpe"):
            path = os.path.join(tmp, name)
            with lzma.open(os.path.join(folder, name + ".xz")) as src, open(path, "wb") as dst:
                dst.write(src.read())
            paths.append(path)
        tok = Tokenizer(models.BPE.from_file(*paths))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([EOT])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT, unk_token=EOT)


def gpt2_model(case, vocab_size, eot_id):
    config = GPT2Config(vocab_size=vocab_size, n_embd=case["hidden"], n_layer=case["layers"], n_head=case["heads"],
                        n_positions=256, bos_token_id=eot_id, eos_token_id=eot_id)
    config.architectures = ["GPT2LMHeadModel"]
    torch.manual_seed(case["seed"])
    return GPT2LMHeadModel(config).to(getattr(torch, case["dtype"]))


def decoder_model(case, vocab_size, eot_id):
    if case["arch"] == "gpt2":
        model = gpt2_model(case, vocab_size, eot_id)
    else:
        model = llama_style_model(case, vocab_size, eot_id)
    with torch.no_grad():  # larger weights than the default init, so that generated tokens vary
        for p in model.parameters():
            p.normal_(0.0, 0.5 if p.dim() > 1 else 1.0)
    return model


def llama_style_model(case, vocab_size, eot_id):
    config_class, model_class, architecture = ARCHS[case["arch"]]
    rope = {"rope_scaling": case["rope_scaling"]} if "rope_scaling" in case else {}
    config = config_class(
        vocab_size=vocab_size, hidden_size=case["hidden"], intermediate_size=case["intermediate"],
        num_hidden_layers=case["layers"], num_attention_heads=case["heads"],
        num_key_value_heads=case["kv_heads"], tie_word_embeddings=case["tied"],
        max_position_embeddings=256, bos_token_id=eot_id, eos_token_id=eot_id, **rope, **case.get("config", {}))
    config.architectures = [architecture]
    torch.manual_seed(case["seed"])
    return model_class(config).to(getattr(torch, case["dtype"]))


def llama3_bos(tokenizer):
    """Meta's later revision of the Llama 3 tokenizer.json: the post-processor adds <|begin_of_text|>."""
    bos = "<|begin_of_text|>"
    tokenizer["post_processor"] = {"type": "Sequence", "processors": [tokenizer["post_processor"], {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [128000], "tokens": [bos]}}}]}


# Edits of a published tokenizer.json (in place)
TOKENIZER_EDITS = {"llama3_bos": llama3_bos}


def main(case_path, out):
    with open(case_path) as f:
        case = json.load(f)
    if "tokenizer_files" in case:  # a published tokenizer.json / tokenizer_config.json, copied as they are
        model = decoder_model(case, case["vocab_size"], case["eos_token_id"])
        model.save_pretrained(out)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            with lzma.open(os.path.join(case["tokenizer_files"], name + ".xz")) as src, \
                    open(os.path.join(out, name), "wb") as dst:
                dst.write(src.read())
        if "tokenizer_edit" in case:
            path = os.path.join(out, "tokenizer.json")
            with open(path, encoding="utf-8") as f:
                tokenizer = json.load(f)
            TOKENIZER_EDITS[case["tokenizer_edit"]](tokenizer)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(tokenizer, f, ensure_ascii=False)
        return
    tokenizer = gpt2_tokenizer(case["tokenizer"])
    model = decoder_model(case, len(tokenizer), tokenizer.convert_tokens_to_ids(EOT))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if case["arch"] == "gpt2":  # the converter reads n_ctx, which OpenAI's config.json has and transformers 5 drops
        path = os.path.join(out, "config.json")
        with open(path) as f:
            config = json.load(f)
        config["n_ctx"] = config["n_positions"]
        with open(path, "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
