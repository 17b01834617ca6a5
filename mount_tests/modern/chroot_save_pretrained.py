"""Runs inside the Debian unstable chroot (python3-transformers 5.x, torch 2.x): the real
save_pretrained(max_shard_size=SIZE) of a model holding a mounted view's tensors, compared file by file
with the view's shards and index; then from_pretrained of the sharded view loads the same tensors.

    python3 chroot_save_pretrained.py JOBS.json

JOBS: [{"label", "view": the mounted folder (model-0000I-of-0000N.safetensors + model.safetensors.index.json,
the single file under unsharded/), "config": a folder with the model's config.json, "size": max_shard_size as
given to save_pretrained (a string such as "40KB", or bytes), "out": an empty folder for save_pretrained's
files, "min_shards": the fewest shards the view must have}].  The model: AutoModelForCausalLM.from_config(
config, dtype of the view's tensors), its state dict loaded from VIEW/unsharded/model.safetensors (tied weights
may be absent), so save_pretrained splits it in the model's own state_dict order and writes what it writes.
chroot_clients.py (beside this script) supplies the tensor comparison and the PASS/FAIL lines; exit 1 if any
check failed.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chroot_clients import run_checks, same_state, summary  # noqa: E402

INDEX = "model.safetensors.index.json"


def weight_files(folder):
    return sorted(f for f in os.listdir(folder) if f.startswith("model") and ".safetensors" in f)


def reference_model(job):
    weights = load_file(os.path.join(job["view"], "unsharded", "model.safetensors"))
    dtype = next(iter(weights.values())).dtype
    config = AutoConfig.from_pretrained(job["config"])
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    loaded = {model.state_dict()[k].data_ptr() for k in weights}
    untied = [k for k in missing if model.state_dict()[k].data_ptr() not in loaded]
    assert not unexpected and not untied, f"{job['view']}: unexpected {unexpected}, missing {untied}"
    return model.eval(), config, dtype


def checks_of(job, state):
    label = job["label"]

    def save_pretrained_writes_the_same_files():
        model, config, dtype = reference_model(job)
        state.update(model=model, config=config, dtype=dtype)
        model.save_pretrained(job["out"], max_shard_size=job["size"])
        theirs, ours = weight_files(job["out"]), weight_files(job["view"])
        assert theirs == ours, f"save_pretrained wrote {theirs}; the view has {ours}"
        shards = [f for f in ours if f != INDEX]
        assert INDEX in ours and len(shards) >= job["min_shards"], f"{len(shards)} shards: {ours}"
        for name in ours:
            with open(os.path.join(job["out"], name), "rb") as f:
                want = f.read()
            with open(os.path.join(job["view"], name), "rb") as f:
                got = f.read()
            assert got == want, (f"{name}: {len(got)} bytes, save_pretrained's {len(want)}; first difference at "
                                 f"{next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))}")
        with open(os.path.join(job["out"], INDEX)) as f:
            print(f"  {label}: {len(shards)} shards, index metadata {json.load(f)['metadata']}")
        return len(ours)

    def from_pretrained_loads_the_same_tensors():
        assert "model" in state, "no reference model"
        # the config (and generation config: fp32/ and tags/<tag>/ hold neither) from the config folder
        loaded, info = AutoModelForCausalLM.from_pretrained(
            job["view"], config=state["config"], generation_config=state["model"].generation_config,
            dtype=state["dtype"], output_loading_info=True)
        bad = {k: v for k, v in info.items() if v}
        assert not bad, f"from_pretrained: loading info not clean: {bad}"
        return same_state("from_pretrained", loaded.state_dict(), state["model"].state_dict(), False)

    return [(f"{label}: save_pretrained(max_shard_size={job['size']!r}) writes the view's files byte for byte",
             save_pretrained_writes_the_same_files),
            (f"{label}: from_pretrained of the sharded view loads the reference's tensors",
             from_pretrained_loads_the_same_tensors)]


def main():
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    checks = []
    for job in jobs:
        checks += checks_of(job, {})
    return summary(len(checks), run_checks(checks, unit="files or tensors"))


if __name__ == "__main__":
    sys.exit(main())
