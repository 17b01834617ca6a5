"""Runs by hand in the sid chroot (torch 2.14, transformers 5.12, PyYAML) with megatron-core on PYTHONPATH:

    PYTHONPATH=/opt/megatron-lm python3 chroot_verl_megatron_config.py BRIDGE_ITER_DIR GOLDEN_HF_DIR OUT_ROLE_DIR

Writes the two things verl's Megatron backend writes beside actor/dist_ckpt/ for the model of a real Megatron-Bridge
save (volcengine/verl b178a3cd5, verl/utils/checkpoint/megatron_checkpoint_manager.py save_checkpoint):
- OUT_ROLE_DIR/transformer_config.json: rank 0's dump of the model's megatron-core TransformerConfig: asdict() of the
  dataclass without the bypassed hook fields, torch dtypes and AttnBackend written as str(), callables dropped,
  json.dump(indent=2). The TransformerConfig is built here by megatron-core itself from the TransformerConfig fields
  of Bridge's run_config.yaml model: section (Bridge's GPTModelProvider subclasses it), activation SiLU, bf16
  dtypes. megatron-core core_v0.13.1, the release verl's install guide names (docs/start/install.rst): its
  TransformerConfig has no transformer_impl yet, so the dump says nothing of the layer spec and the model's names are
  TransformerEngine's, as verl's default spec builds it (the DCP keys are the same under either spec).
- OUT_ROLE_DIR/huggingface/: the HF config and tokenizer as rank 0 saves them there (hf_config.save_pretrained,
  processing_class.save_pretrained), from the golden HF model's config and tokenizer files.
"""
import dataclasses
import json
import os
import sys

import torch
import yaml

from megatron.core.transformer.enums import AttnBackend
from megatron.core.transformer.transformer_config import TransformerConfig
from transformers import AutoConfig, AutoTokenizer

iter_dir, hf_dir, out = sys.argv[1:4]
with open(os.path.join(iter_dir, "run_config.yaml")) as f:
    model = yaml.safe_load(f)["model"]
fields = {f.name for f in dataclasses.fields(TransformerConfig)}
# plain values only: Bridge writes objects (dtypes, functions, enums) as {_target_: ...} mappings
kwargs = {k: v for k, v in model.items() if k in fields and not isinstance(v, dict)}
kwargs.update(activation_func=torch.nn.functional.silu, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
              autocast_dtype=torch.bfloat16)
config = TransformerConfig(**kwargs)

# verl's dump (megatron_checkpoint_manager.py, "Save transformer config")
BYPASS = ["finalize_model_grads_func", "grad_scale_func", "no_sync_func", "grad_sync_func", "param_sync_func",
          "generation_config", "_pg_collection"]
for k in BYPASS:
    if hasattr(config, k):
        delattr(config, k)
dump = dataclasses.asdict(config)
for key, value in list(dump.items()):
    if type(value) in (torch.dtype, AttnBackend):
        dump[key] = str(value)
    if callable(value):
        dump.pop(key)
os.makedirs(os.path.join(out, "huggingface"), exist_ok=True)
with open(os.path.join(out, "transformer_config.json"), "w") as f:
    json.dump(dump, f, indent=2)
AutoTokenizer.from_pretrained(hf_dir).save_pretrained(os.path.join(out, "huggingface"))
AutoConfig.from_pretrained(hf_dir).save_pretrained(os.path.join(out, "huggingface"))
print("wrote", len(dump), "TransformerConfig fields")
