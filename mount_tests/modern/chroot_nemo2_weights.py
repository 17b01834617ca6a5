"""Runs in the sid chroot (torch 2.14): python3 chroot_nemo2_weights.py SRC_ITER_DIR DST_CHECKPOINT_FOLDER.

Re-lays a real Megatron-Bridge torch_dist iteration dir as NeMo 2's checkpoint folder (NVIDIA/NeMo
nemo/lightning/ckpt_utils.py WEIGHTS_PATH / CONTEXT_PATH, io/mixin.py IOMixin.io_dump(yaml_attrs=["model"]),
pytorch/strategies/megatron_strategy.py): weights/ rewritten with torch's own DCP reader and writer, every model key
under MegatronParallel's `module.` prefix (optimizer and run state as they are, bytes items byte for byte), plus
metadata.json and a common.pt of Lightning's state; context/model.yaml the model's fiddle config (_target_ the model
class, config: the GPTConfig: here the Bridge run_config.yaml's model: section, which holds the same
TransformerConfig fields, under NeMo's Qwen3Config and local_layer_spec; should_pad_vocab is Bridge's own, dropped),
context/io.json, context/nemo_tokenizer/ the HF tokenizer files of Bridge's tokenizer/.
"""
import os
import shutil
import sys

import torch
import yaml

from chroot_dcp_raw import load_raw, save_raw

src, dst = sys.argv[1], sys.argv[2]
RUN_STATE = ("optimizer.", "rng_state", "rerun_state_machine", "common_state")
state = {(k if k.startswith(RUN_STATE) else "module." + k): v for k, v in load_raw(src).items()}
weights = os.path.join(dst, "weights")
os.makedirs(weights)
save_raw(state, weights)
shutil.copy(os.path.join(src, "metadata.json"), weights)
torch.save({"epoch": 0, "global_step": 3, "pytorch-lightning_version": "2.5.1"}, os.path.join(weights, "common.pt"))

context = os.path.join(dst, "context")
os.makedirs(context)
with open(os.path.join(src, "run_config.yaml")) as f:
    config = yaml.safe_load(f)["model"]
config.pop("should_pad_vocab", None)
config["_target_"] = "nemo.collections.llm.gpt.model.qwen3.Qwen3Config"
config["transformer_layer_spec"] = {"_call_": False, "_target_": "nemo.collections.llm.gpt.model.base.local_layer_spec"}
model = {"_target_": "nemo.collections.llm.gpt.model.qwen3.Qwen3Model", "config": config, "model_transform": None,
         "optim": {"_target_": "nemo.lightning.pytorch.optim.megatron.MegatronOptimizerModule"},
         "tokenizer": {"_target_": "nemo.collections.common.tokenizers.huggingface.auto_tokenizer.AutoTokenizer",
                       "pretrained_model_name": "nemo_tokenizer"}}
with open(os.path.join(context, "model.yaml"), "w") as f:
    yaml.safe_dump(model, f)
with open(os.path.join(context, "io.json"), "w") as f:
    f.write('{"root": {"key": "trainer_context_1"}, "objects": {}, "refcounts": {}, "version": "0.0.1"}\n')
shutil.copytree(os.path.join(src, "tokenizer"), os.path.join(context, "nemo_tokenizer"))
print("wrote", len(state), "items")
