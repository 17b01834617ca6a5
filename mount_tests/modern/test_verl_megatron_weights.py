"""verl's Megatron backend from every entry point, with real weights (mount_tests/test_verl_megatron.py has the layout,
its notes and the config errors): the real Megatron-Bridge Qwen3 save's model re-written as the dist_ckpt/ verl writes
without the optimizer (chroot_verl_dist_ckpt.py, torch 2.14's DCP in the sid chroot), beside the transformer_config.json
and huggingface/ of fixtures/megatron-2026-real/verl_megatron_layout/.  Exported and mounted from the run dir, the step
dir, actor/ and dist_ckpt/: model.safetensors is Bridge's own TP=1 load (under TransformerEngine's names, verl's layer
spec), no fp32/ (no optimizer saved), hf/ the golden Hugging Face model byte for byte with huggingface/'s config and
tokenizer, and from_pretrained of the mounted hf/ gives the golden model's logits.
"""
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import helpers as H  # noqa: E402
from mounting import mounted  # noqa: E402
from test_megatron_2026 import rewritten_in_chroot  # noqa: E402
from test_megatron_hf import SCRIPTS, chroot_dir, run_logits  # noqa: E402,F401 (chroot_dir: a fixture)
from test_modern_clients import staged  # noqa: E402,F401 (staged: a fixture)
from test_real_megatron import check_mount  # noqa: E402
from test_real_megatron_2026 import BRIDGE_QWEN3, REAL_DIR  # noqa: E402
from test_verl_megatron import STEP, check_verl_views, entry_points, verl_run_dir  # noqa: E402


def test_verl_megatron_save_from_every_entry_point(chroot_dir, staged, export_cache, ckptfs_bin, tmp_path):
    host, _ = rewritten_in_chroot(chroot_dir, staged, "chroot_verl_dist_ckpt.py", BRIDGE_QWEN3, "dist_ckpt")
    run = verl_run_dir(tmp_path / "run", os.path.join(host, "dist_ckpt"))
    for label, src in entry_points(run):
        proc, out = export_cache(src)
        H.assert_ok(proc)
        check_verl_views(str(out), f"verl {label} export")
    check_mount(export_cache, ckptfs_bin, tmp_path / "mnt", run, STEP, check_verl_views,
                ["model.safetensors", "hf/model.safetensors", "hf/config.json"], "verl run dir")
    # from_pretrained of the mounted hf/ in the chroot: the golden model's logits
    host, inside, mnt, mnt_inside = staged("verl-megatron-logits", *SCRIPTS)
    shutil.copytree(os.path.join(REAL_DIR, BRIDGE_QWEN3, "expected", "hf_llama"), os.path.join(host, "ref"))
    with mounted(ckptfs_bin, run, mnt):
        run_logits(chroot_dir[0], inside, f"{inside}/ref", [f"{mnt_inside}/hf", f"{mnt_inside}/tags/{STEP}/hf"])
