"""The real DeepSpeed 0.19.5 and verl checkpoints (mount_tests/fixtures/deepspeed-0.19-real, verl-real) read
through a ckptfs mount by the torch 2.6 clients (Debian 13 chroot, ${CKPTFS_CHROOT}) and the torch 2.14
clients (Debian unstable chroot, ${CKPTFS_SID_CHROOT}); the host tests (test_real_deepspeed.py,
test_real_deepspeed_moe.py, test_real_verl.py) read the same views with the host's torch 1.13 only.

Every weights view of the mount (the root and every tags/<tag>/: model.safetensors, fp32/model.safetensors,
fp32/pytorch_model.bin) is read inside the chroot by chroot_clients.py --manifests: safe_open (every tensor,
get_slice), safetensors.torch.load_file and save_file's bytes for the tensors read, torch.load(weights_only=True)
with mmap=True and mmap=False; each tensor's dtype, shape and sha256 against the golden manifests, with the
host tests' rules: DeepSpeed model.safetensors = model_16bit/; fp32/ = golden_fp32 (float32, the golden's
16-bit frozen params compared after a cast back, zero_to_fp32's order in pytorch_model.bin) or, without one
(AutoTP) and for DeepSpeed's own *_universal tag, ds_to_universal's fp32.pt for every trainable param and
model_16bit/ cast back for the rest; verl model.safetensors = the merger's golden, fp32/ = golden.native.
"""
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.insert(0, TESTS)
import helpers as H  # noqa: E402
import test_dcp as TD  # noqa: E402 (Staging: chroot_clients.py staged under CHROOT/tmp/, the mount under CHROOT/mnt/)
from mounting import mounted  # noqa: E402

FIXTURES = os.path.join(TESTS, "fixtures")
DS_CASES = ["autotp2_z1_bf16_ws2", "moe_ep2_z2_bf16_ws2", "pp2_bf16_ws2", "z0_bf16_ws2", "z3_bf16_pg2_ws2"]
VERL_CASES = ["fsdp1_fp32_ws2", "fsdp2_fp32_ws2"]
CASES = [f"deepspeed-0.19-real/{c}" for c in DS_CASES] + [f"verl-real/{c}" for c in VERL_CASES]
DS_TAG = "global_step3"
FLOATS = ("float32", "bfloat16", "float16")
WEIGHTS = (".safetensors", ".bin")


def load_json(case, *parts):
    path = os.path.join(FIXTURES, case, *parts)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def exact(manifest):
    return {k: {"dtype": m["dtype"], "shape": m["shape"], "sha256": m["sha256"]} for k, m in manifest.items()}


def as_fp32(k, m):
    """ckptfs serves every float as float32; a 16-bit golden tensor (frozen param) is compared cast back."""
    assert m["dtype"] in FLOATS, f"{k}: golden dtype {m['dtype']} has no fp32 rule"
    e = {"dtype": "float32", "shape": m["shape"], "sha256": m["sha256"]}
    return e if m["dtype"] == "float32" else {**e, "hashed_as": m["dtype"]}


def fp32_from_universal(universal, m16):
    """ds_to_universal's fp32.pt for every trainable param (ZeRO-3's are flat: the same bytes, so the
    module's shape), model_16bit/ cast back for frozen params and buffers."""
    assert set(universal) <= set(m16), f"universal params not in model_16bit: {set(universal) - set(m16)}"
    out = {}
    for k, m in m16.items():
        fp32 = universal.get(k, {}).get("fp32.pt")
        out[k] = {"dtype": "float32", "shape": m["shape"], "sha256": fp32["sha256"]} if fp32 else as_fp32(k, m)
    return out


def views(model, fp32, ordered_bin):
    """{view: (manifest entries, whether pytorch_model.bin keeps the golden's key order)}"""
    return {"model.safetensors": (model, False), "fp32/model.safetensors": (fp32, False),
            "fp32/pytorch_model.bin": (fp32, ordered_bin)}


def deepspeed_tags(case):
    m16 = load_json(case, "model_16bit", "pytorch_model.manifest.json")
    golden = load_json(case, "golden_fp32.manifest.json")
    universal = load_json(case, "universal.manifest.json")
    model = exact(m16)
    tags = {DS_TAG: views(model, {k: as_fp32(k, m) for k, m in golden.items()}, True) if golden
            else views(model, fp32_from_universal(universal, m16), False)}
    if os.path.isdir(os.path.join(FIXTURES, case, "checkpoint", f"{DS_TAG}_universal")):
        tags[f"{DS_TAG}_universal"] = views(model, fp32_from_universal(universal, m16), False)
    return tags, DS_TAG


def verl_tags(case):
    """The tracker's step has golden.*, an older step golden_<step>.* (as test_real_verl.py reads them)."""
    save = os.path.join(FIXTURES, case, "checkpoint")
    with open(os.path.join(save, "latest_checkpointed_iteration.txt")) as f:
        latest = f"global_step_{f.read()}"
    tags = {}
    for step in sorted(d for d in os.listdir(save) if d.startswith("global_step_")):
        g = "golden" if step == latest else f"golden_{step}"
        tags[step] = views(exact(load_json(case, f"{g}.manifest.json")),
                           exact(load_json(case, f"{g}.native.manifest.json")), False)
    return tags, latest


def expected_views(case):
    """{path below the mount: (manifest entries, ordered)} for the root (the latest tag) and every tags/<tag>/."""
    tags, latest = (deepspeed_tags if case.startswith("deepspeed") else verl_tags)(case)
    out = dict(tags[latest])
    for tag, vs in tags.items():
        out.update({f"tags/{tag}/{v}": e for v, e in vs.items()})
    return out


def weights_views(mnt):
    return sorted(os.path.relpath(os.path.join(dp, f), mnt) for dp, _, fs in os.walk(mnt) for f in fs
                  if f.endswith(WEIGHTS))


def test_every_real_case_is_listed():
    for fixture_set, names in (("deepspeed-0.19-real", DS_CASES), ("verl-real", VERL_CASES)):
        found = sorted(d for d in os.listdir(os.path.join(FIXTURES, fixture_set))
                       if os.path.isdir(os.path.join(FIXTURES, fixture_set, d, "checkpoint")))
        assert found == names, f"{fixture_set}: cases {found}, this test reads {names}"


@pytest.mark.parametrize("client", TD.CLIENT_CHROOTS)
@pytest.mark.parametrize("case", CASES)
def test_clients_read_every_view(ckptfs_bin, case, client):
    chroot = TD.CLIENT_CHROOTS[client]
    if TD.SKIP_MODERN:
        pytest.skip("CKPTFS_SKIP_MODERN=1")
    if not TD.RG.chroot_ready(chroot):
        pytest.fail(f"the {client} client chroot is not set up ({chroot}/.ckptfs-chroot-complete missing): "
                    f"point CKPTFS_CHROOT / CKPTFS_SID_CHROOT at it (or set CKPTFS_SKIP_MODERN=1)", pytrace=False)
    expected = expected_views(case)
    staging = TD.Staging(f"real-clients-{case.replace('/', '-')}", chroot)
    try:
        with mounted(ckptfs_bin, os.path.join(FIXTURES, case, "checkpoint"), staging.mnt) as mnt:
            assert weights_views(mnt) == sorted(expected), f"{case}: the mount's weights views"
            spec = os.path.join(staging.host, "spec.json")
            with open(spec, "w") as f:
                json.dump({"scratch": staging.inside(staging.host),
                           "views": [{"label": v, "path": staging.inside(os.path.join(mnt, v)), "tensors": t,
                                      "ordered": o} for v, (t, o) in expected.items()]}, f)
            proc = TD.in_chroot("python3", f"{staging.inside(staging.host)}/chroot_clients.py", "--manifests",
                                staging.inside(spec), chroot=chroot)
    finally:
        staging.cleanup()
    what = f"{case} read by the {client} clients:\n{H.describe(proc)}"
    assert proc.returncode == 0 and "FAIL" not in proc.stdout, what
    assert proc.stdout.count("PASS ") == sum(3 if v.endswith(".safetensors") else 2 for v in expected), what
