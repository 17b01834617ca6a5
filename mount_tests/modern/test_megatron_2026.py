"""Issue 32's silent error: a torch_dist MoE save with the distributed optimizer (dp_reshardable) holds its
ChainedOptimizer's state under chained_0. / chained_1. keys, which ckptfs served in model.safetensors as weights.

The real Megatron-LM 2a75ac12c5 case mount_tests/fixtures/megatron-2026-real/shared_torch_dist_qwen3moe_ep2 is
rewritten in the Debian unstable chroot by torch 2.14's own DCP reader and writer (chroot_chained_optimizer.py):
its model and run-state items kept byte for byte, its optimizer state replaced by chained distributed-optimizer
keys.  The mount's model.safetensors must still be Megatron's own TP=1 load (expected/manifest.json,
expected/full_model.pt), with no fp32/ and a note saying why.

NeMo 2's checkpoint folder is the real Bridge Qwen3 save re-laid there as NeMo 2 writes it (chroot_nemo2_weights.py:
weights/ with every model key under `module.`, context/model.yaml, context/nemo_tokenizer/); mounted from its
checkpoints dir, the folder and weights/, it must hold the real case's expected/ model, fp32 masters and hf/.

The mounted hf/ of every real case (Qwen3-MoE torch_dist, Bridge's Qwen3 and Qwen3-MoE) loads with
from_pretrained there and gives the golden model's logits.  Needs ${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid}
(skipped with CKPTFS_SKIP_MODERN=1, like the other tests here).
"""
import json
import os
import shutil
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import helpers as H  # noqa: E402
from mounting import mounted  # noqa: E402
from test_megatron_hf import SCRIPTS, chroot_dir, require_sid, run_logits  # noqa: E402,F401 (chroot_dir: a fixture)
from test_modern_clients import in_chroot, staged  # noqa: E402,F401 (staged: a fixture)
from test_real_megatron import check_model, check_mount  # noqa: E402
from test_real_megatron_2026 import BRIDGE_QWEN3, CASES, REAL_DIR, TAG, TORCH_DIST_MOE, check_views, views  # noqa: E402


def rewritten_in_chroot(chroot_dir, staged, script, case, out):
    """Runs `script` (with chroot_dcp_raw.py) in the sid chroot on a copy of the real `case`'s iteration dir,
    writing `out` (relative to the staged folder); returns the staged folder's host path and mount point."""
    root = require_sid(chroot_dir)
    host, inside, mnt, _ = staged(script.split(".")[0], *(os.path.join(HERE, f) for f in (script, "chroot_dcp_raw.py")))
    shutil.copytree(os.path.join(REAL_DIR, case, "checkpoint", TAG), os.path.join(host, "src"))
    proc = in_chroot(root, "python3", f"{inside}/{script}", f"{inside}/src", f"{inside}/{out}")
    assert proc.returncode == 0, H.describe(proc)
    return host, mnt


def test_chained_distributed_optimizer_state_is_not_served_as_weights(chroot_dir, staged, ckptfs_bin):
    host, mnt = rewritten_in_chroot(chroot_dir, staged, "chroot_chained_optimizer.py", TORCH_DIST_MOE, f"save/{TAG}")
    save = os.path.join(host, "save")
    shutil.copy(os.path.join(REAL_DIR, TORCH_DIST_MOE, "checkpoint", "latest_checkpointed_iteration.txt"), save)
    with mounted(ckptfs_bin, save, mnt) as m:
        model = check_model(m, TORCH_DIST_MOE, "chained optimizer save: mount", real_dir=REAL_DIR)
        assert not [k for k in model if k.startswith("chained_")]
        assert not os.path.exists(os.path.join(m, "fp32")), sorted(os.listdir(m))
        with open(os.path.join(m, "ckptfs.json")) as f:
            notes = json.load(f)["tags"][0]["notes"]
    assert any("chained optimizer" in n and "fp32" in n for n in notes), notes


@pytest.mark.parametrize("name", CASES)
def test_from_pretrained_of_the_mounted_hf(chroot_dir, staged, ckptfs_bin, name):
    """AutoModelForCausalLM.from_pretrained(MNT/hf) of each real case (Qwen3, Qwen3-MoE: transformers 5.12 fuses
    the per-expert tensors as it loads) gives the golden model's logits exactly, and within 1e-6 those its
    logits_check.json records."""
    root = require_sid(chroot_dir)
    host, inside, mnt, mnt_inside = staged(f"megatron-2026-{name}", *SCRIPTS)
    shutil.copytree(os.path.join(REAL_DIR, name, "expected", "hf_llama"), os.path.join(host, "ref"))
    with mounted(ckptfs_bin, os.path.join(REAL_DIR, name, "checkpoint"), mnt):
        run_logits(root, inside, f"{inside}/ref", [f"{mnt_inside}/hf", f"{mnt_inside}/tags/{CASES[name][0]}/hf"])


NEMO2_NAME = "qwen3--reduced_train_loss=10.37-epoch=0-consumed_samples=24.0-step=3-last"


def test_nemo2_checkpoint_folder_mounts(chroot_dir, staged, export_cache, ckptfs_bin, tmp_path):
    host, _ = rewritten_in_chroot(chroot_dir, staged, "chroot_nemo2_weights.py", BRIDGE_QWEN3,
                                  f"checkpoints/{NEMO2_NAME}")
    checkpoints = os.path.join(host, "checkpoints")
    folder = os.path.join(checkpoints, NEMO2_NAME)
    with open(os.path.join(folder, "weights", ".metadata"), "rb") as f:
        assert b"module.decoder.layers" in f.read(), "the model keys were not renamed"
    check_mount(export_cache, ckptfs_bin, tmp_path / "mnt", checkpoints, NEMO2_NAME, check_views(BRIDGE_QWEN3),
                views(BRIDGE_QWEN3) + ["model.yaml", "io.json"], "NeMo 2 checkpoints dir")
    proc, out = export_cache(folder)
    H.assert_ok(proc)
    check_views(BRIDGE_QWEN3)(str(out), "NeMo 2 checkpoint folder export")  # tokenizer from context/nemo_tokenizer/
    proc, out = export_cache(os.path.join(folder, "weights"))
    H.assert_ok(proc)
    check_model(str(out), BRIDGE_QWEN3, "NeMo 2 weights/ export", real_dir=REAL_DIR)
    proc = H.run([ckptfs_bin, "inspect", checkpoints, "--json"])
    H.assert_ok(proc)
    tags = json.loads(proc.stdout)["tags"]
    assert [t["name"] for t in tags] == [NEMO2_NAME], tags
    assert tags[0]["format"].startswith("NeMo 2 checkpoint (torch_dist; model config: context/model.yaml"), tags[0]
    # a broken model.yaml is exit 4 naming it and the field
    model_yaml = os.path.join(folder, "context", "model.yaml")
    with open(model_yaml) as f:
        text = f.read()
    with open(model_yaml, "w") as f:
        f.write(text.replace("  num_layers: 4\n", "  num_layers: four\n"))
    proc = H.run([ckptfs_bin, "inspect", folder])
    assert proc.returncode == 4, H.describe(proc)
    assert f"{model_yaml}: config.num_layers: expected an integer" in proc.stderr, proc.stderr
