"""ckptfs against real per-rank FSDP saves (mount_tests/fixtures/fsdp-local-real, see its README.md: torch 2.14.1
FSDP on CPU gloo, transformers 5.12.1, accelerate 1.14.0): an FSDP1 LOCAL_STATE_DICT save (`rank{R}.pt`,
use_orig_params=False), accelerate's `Accelerator.save_state` of one (`pytorch_model_fsdp_rank{R}.bin` beside the
optimizer's DCP dir, use_orig_params=True: alignment padding) and an FSDP2 per-rank DTensor save (`rank{R}.pt`).

Each case's `checkpoint/` is mounted and checked against FSDP's own full state dict of the same model at the same
step (expected/full_state_dict.pt and expected/manifest.json): model.safetensors holds exactly the golden's names,
dtypes, shapes and bytes; fp32/model.safetensors and fp32/pytorch_model.bin the same float32 values;
config.json is the saved one byte for byte.  `ckptfs inspect` names every FSDP1 unit.  transformers'
from_pretrained of the FSDP1 mount (in the Debian unstable chroot) gives the golden model's logits.

The view checks and the from_pretrained runner here serve test_fsdp_local.py (the generated cases) too.
"""
import filecmp
import json
import os
import pickletools
import shutil
import struct
import sys
import zipfile

import pytest
import torch

import helpers as H
from mounting import mounted

sys.path.insert(0, os.path.join(H.HERE, "modern"))
from test_modern_clients import chroot_versions, in_chroot, staged  # noqa: E402,F401 (staged: a fixture)

REAL_DIR = os.path.join(H.HERE, "fixtures", "fsdp-local-real")
CASES = ["fsdp1_llama_ws2_fp32_flat", "accelerate_llama_ws2_fp32_orig", "fsdp2_llama_ws2_fp32_rankpt"]
SID = os.path.abspath(os.environ.get("CKPTFS_SID_CHROOT", "/var/cache/ckptfs/sid"))
HF_SCRIPTS = [os.path.join(H.HERE, "modern", "chroot_hf_logits.py"), os.path.join(H.HERE, "modern",
                                                                                  "chroot_clients.py")]


def load_json(path):
    with open(path) as f:
        return json.load(f)


# ----------------------------------------------------------------------------------------------------------------
# the checks of a mounted view against a golden (expected/<stem>.pt and its manifest), shared with test_fsdp_local.py

def golden(exp_dir, stem="full_state_dict"):
    """(tensors, manifest entries by name) of expected/<stem>.pt, the manifest's sha256 checked against them."""
    tensors = torch.load(os.path.join(exp_dir, stem + ".pt"), map_location="cpu", weights_only=True)
    manifest = load_json(os.path.join(exp_dir, "manifest.json" if stem == "full_state_dict" else "flat_manifest.json"))
    entries = {e["name"]: e for e in manifest["tensors"]}
    assert list(entries) == list(tensors), f"{exp_dir}/{stem}: manifest and tensors list different names"
    for k, e in entries.items():
        t = tensors[k]
        assert (str(t.dtype), list(t.shape)) == (f"torch.{e['dtype']}", e["shape"]), f"{exp_dir}/{stem} {k}"
        assert H.sha256_le(t) == e["sha256"], f"{exp_dir}/{stem} {k}: sha256 differs from the manifest's"
    return tensors, entries


def check_state(ours, exp, entries, what, as_float32=False):
    """`ours` has exactly the golden's names; each tensor equals the golden (cast to float32 with as_float32),
    dtype, shape and bytes; in the stored dtype its sha256 is the manifest's."""
    want = {k: (v.float() if as_float32 and v.is_floating_point() else v) for k, v in exp.items()}
    H.assert_state_equal(ours, want, ordered=False, what=what)
    if not as_float32:
        for k, e in entries.items():
            assert H.sha256_le(ours[k]) == e["sha256"], f"{what} {k}: sha256 differs from the manifest's"


def check_views(d, exp_dir, what, stem="full_state_dict", config=None):
    """The views in folder `d` against expected/<stem>: model.safetensors in the stored dtype; fp32/ (both files)
    in float32, required where every golden tensor is float32 (fp32 flat parameters) and exact where present
    otherwise; config.json byte-identical to `config`, or absent when the save has none."""
    exp, entries = golden(exp_dir, stem)
    check_state(H.read_safetensors(os.path.join(d, "model.safetensors")), exp, entries, f"{what} model.safetensors")
    all_fp32 = all(v.dtype == torch.float32 for v in exp.values())
    fp32_dir = os.path.join(d, "fp32")
    if all_fp32 or os.path.exists(fp32_dir):
        check_state(H.read_safetensors(os.path.join(fp32_dir, "model.safetensors")), exp, entries,
                    f"{what} fp32/model.safetensors", as_float32=True)
        check_state(torch.load(os.path.join(fp32_dir, "pytorch_model.bin"), map_location="cpu", weights_only=True),
                    exp, entries, f"{what} fp32/pytorch_model.bin", as_float32=True)
    if config:
        assert filecmp.cmp(os.path.join(d, "config.json"), config, shallow=False), \
            f"{what} config.json is not {config} byte for byte"
    else:
        assert not os.path.exists(os.path.join(d, "config.json")), f"{what}: a config.json the save does not have"


def assert_inspect_names(ckptfs_bin, src, names, what):
    """`ckptfs inspect SRC` exits 0 and its text names each of `names` (the FSDP units)."""
    proc = H.run([ckptfs_bin, "inspect", src])
    H.assert_ok(proc)
    missing = [n for n in names if n not in proc.stdout]
    assert not missing, f"{what}: inspect does not name {missing}\n{H.describe(proc)}"
    return proc


# ----------------------------------------------------------------------------------------------------------------
# from_pretrained of a mount in the Debian unstable chroot

@pytest.fixture(scope="session")
def chroot_dir():
    """The sid chroot (transformers 5, torch 2.14): `staged` stages there.  Skipped with CKPTFS_SKIP_MODERN=1 or
    when ${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid} is not set up."""
    if os.environ.get("CKPTFS_SKIP_MODERN") == "1":
        pytest.skip("CKPTFS_SKIP_MODERN=1")
    versions = chroot_versions(SID)
    if versions is None or versions.get("transformers", "absent") == "absent":
        pytest.skip(f"no Debian unstable chroot with transformers at {SID} (make it with `CKPTFS_CHROOT={SID} "
                    f"CKPTFS_CHROOT_SUITE=sid bash mount_tests/modern/setup_chroot.sh` or set CKPTFS_SID_CHROOT)")
    return SID, versions


def from_pretrained_matches(staged, ckptfs_bin, label, src, weights):
    """Mounts `src` under the chroot and runs chroot_hf_logits.py on it against `weights` (a golden
    full_state_dict.pt): model.safetensors holds exactly those tensors, from_pretrained(MNT, float32) loads with
    no missing or unexpected keys, its logits equal those of a model built from config.json holding `weights`."""
    _, inside, mnt, mnt_inside = staged(label, *HF_SCRIPTS, weights)
    with mounted(ckptfs_bin, src, mnt):
        proc = in_chroot(SID, "python3", f"{inside}/chroot_hf_logits.py", mnt_inside, "--reference-weights",
                         f"{inside}/{os.path.basename(weights)}")
    assert proc.returncode == 0 and "FAIL" not in proc.stdout and proc.stdout.count("PASS ") == 3, H.describe(proc)


# ----------------------------------------------------------------------------------------------------------------
# the real cases

def case_path(name, *parts):
    return os.path.join(REAL_DIR, name, *parts)


def unit_keys(name):
    layout = load_json(case_path(name, "case.json"))["live_flat_param_layout_rank0"] or []
    return [u["key"] for u in layout]


def test_real_fixtures_present():
    for name in CASES:
        info = load_json(case_path(name, "case.json"))
        for f in info["checkpoint_files"]:
            assert os.path.getsize(case_path(name, "checkpoint", f["path"])) == f["size"], f"{name}/{f['path']}"
        tensors, _ = golden(case_path(name, "expected"))
        assert len(tensors) == info["golden"]["tensors"], name


@pytest.mark.parametrize("name", CASES)
def test_mount_matches_full_state_dict(ckptfs_bin, tmp_path, name):
    with mounted(ckptfs_bin, case_path(name, "checkpoint"), tmp_path / "mnt") as mnt:
        check_views(mnt, case_path(name, "expected"), f"{name} mount",
                    config=case_path(name, "checkpoint", "config.json"))


@pytest.mark.parametrize("name", CASES)
def test_inspect_names_the_units(ckptfs_bin, name):
    assert_inspect_names(ckptfs_bin, case_path(name, "checkpoint"), unit_keys(name), name)


def test_from_pretrained_of_the_mount(chroot_dir, staged, ckptfs_bin):
    name = "fsdp1_llama_ws2_fp32_flat"
    from_pretrained_matches(staged, ckptfs_bin, f"fsdp-real-{name}", case_path(name, "checkpoint"),
                            case_path(name, "expected", "full_state_dict.pt"))


# ----------------------------------------------------------------------------------------------------
# the real FSDP1 save with its keys rewritten (a wrapper's prefix, keys that are no FSDP unit's)

def rewrite_keys(src_file, dst_file, rename):
    """A copy of torch.save zip `src_file` whose data.pkl has every string `rename` maps replaced (the pickle's
    opcodes re-encoded one by one; the storages untouched)."""
    data_pkl = None
    with zipfile.ZipFile(src_file) as zin, zipfile.ZipFile(dst_file, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("data.pkl"):
                out = bytearray()
                ops = list(pickletools.genops(data))
                for i, (op, arg, pos) in enumerate(ops):
                    raw = data[pos:ops[i + 1][2] if i + 1 < len(ops) else len(data)]
                    if op.name in ("SHORT_BINUNICODE", "BINUNICODE") and rename(arg) != arg:
                        b = rename(arg).encode()
                        raw = b"X" + struct.pack("<I", len(b)) + b
                    out += raw
                data = data_pkl = bytes(out)
            zout.writestr(info, data)
    assert data_pkl is not None


def flat_case_with_keys(tmp_path, rename, config=True):
    """fsdp1_llama_ws2_fp32_flat's rank files with their keys renamed, in tmp_path/src."""
    src = tmp_path / "src"
    src.mkdir()
    real = case_path("fsdp1_llama_ws2_fp32_flat", "checkpoint")
    for r in range(2):
        rewrite_keys(os.path.join(real, f"rank{r}.pt"), src / f"rank{r}.pt", rename)
    if config:
        shutil.copy(os.path.join(real, "config.json"), src / "config.json")
    return src


@pytest.mark.parametrize("option", [[], ["-o", "strip_prefix=model."]])
def test_units_under_a_wrappers_prefix_are_cut_and_the_prefix_stripped_once(ckptfs_bin, tmp_path, option):
    """The real save as FSDP writes it for a LightningModule holding the Llama as `self.model` (every unit key
    under `model.`): found against config.json, or given, the prefix is stripped once: the HF names of
    FSDP's own full state dict, byte for byte."""
    src = flat_case_with_keys(tmp_path, lambda s: "model." + s if s.endswith("_flat_param") else s)
    with mounted(ckptfs_bin, src, tmp_path / "mnt", *option) as mnt:
        check_views(mnt, case_path("fsdp1_llama_ws2_fp32_flat", "expected"), f"prefixed units {option}",
                    config=str(src / "config.json"))


def test_sharded_tensors_under_no_unit_key_are_refused(ckptfs_bin, tmp_path):
    """ShardedTensors under keys FSDP never writes (no `<module>._flat_param`): exit 4 naming rank 0's file."""
    src = flat_case_with_keys(tmp_path, lambda s: s.replace("_flat_param", "_sharded"))
    H.assert_one_line_error(H.run([ckptfs_bin, "inspect", src]), H.EXIT_INVALID, ["rank0.pt", "_flat_param"])


def test_a_config_json_of_absurd_sizes_is_a_note_not_a_hang(ckptfs_bin, tmp_path):
    """config.json is untrusted: num_hidden_layers of 10^8 is refused as a config (the flat parameters served
    whole, the note naming config.json), with the table of parameters never built."""
    src = flat_case_with_keys(tmp_path, lambda s: s, config=False)
    config = load_json(case_path("fsdp1_llama_ws2_fp32_flat", "checkpoint", "config.json"))
    config["num_hidden_layers"] = 10 ** 8
    (src / "config.json").write_text(json.dumps(config))
    proc = H.run([ckptfs_bin, "inspect", src], timeout=30)
    H.assert_ok(proc)
    assert "num_hidden_layers is 100000000" in proc.stdout and "_flat_param" in proc.stdout, proc.stdout
