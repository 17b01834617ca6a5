"""Megatron-LM checkpoints end to end: ``ckptfs export`` and the FUSE mount of every case of
mount_tests/gen_megatron/ (legacy ``--ckpt-format torch``: TP 1/2/4 x PP 1/2/4 x VP 1/2, GQA/MHA, SwiGLU/GeLU,
tied and untied, core local/TE spec and legacy nested names, non-distributed and distributed optimizers,
bf16/fp16/fp32, release and multi-iteration save dirs, MoE with EP 1/2 (SequentialMLP / TEGroupedMLP, rank
dirs mp_rank_TT[_PPP]_EEE, ChainedOptimizer; with the distributed optimizer distrib_optim.pt is the list
[dense state, expert state], the dense entry None in the EP rank > 0 dirs); ``torch_dist`` dirs written by torch.distributed.checkpoint in
the Debian 13 chroot at DP 1, 2 and 4 (the replicas sharing the writing as Megatron's fully parallel save does,
each DP rank writing its own slice of the optimizer's buckets): stacked layers, TP chunks, SwiGLU 2*TP fc1 chunks, optimizer.state.fp32_param, the common
state in common.pt or (core 0.19+) in the DCP item common_state/shard_0_1, the distributed optimizer's
dp_reshardable per-bucket tensors, dp_zero_gather_scatter param_state objects and fully_sharded_model_space's
flattened per-DP-rank ranges; distrib_optim.pt of core 0.7+ (coalesced; also several gradient buckets
with overlap_grad_reduce), core 0.4-0.6 (a list of buckets, one or several per buffer) and 2023-05 (one
padded buffer)) compared
byte for byte with the generator's expectations:
model.safetensors, fp32/model.safetensors, fp32/pytorch_model.bin, hf/model.safetensors + hf/config.json
(Llama/Qwen2-style, GPT-2-style, Mixtral-style MoE and Qwen3-MoE-style MoE with q/k norms and dense layers) and
the tokenizer files; then broken checkpoints must fail with exit 4
and a one-line message naming the file.

    CKPTFS_BIN=$PWD/build/ckptfs /usr/bin/python3 -m pytest mount_tests/test_megatron.py -q -p no:cacheprovider

The cases are generated once into ${CKPTFS_MEGATRON_FIXTURES:-${CKPTFS_FIXTURES:-build}/fixtures-megatron}
(cached while the generator's GEN_VERSION is unchanged).  The torch_dist cases need the chroot
${CKPTFS_CHROOT:-build/trixie} (`bash mount_tests/modern/setup_chroot.sh`; .ci/run uses
/var/cache/ckptfs/trixie): without it they fail saying so, with CKPTFS_SKIP_MODERN=1 they are skipped (and
not generated).  Cases that fit no Hugging Face family (a squared-ReLU MLP, GeLU with rotary positions,
Mixtral-style MoE beside dense layers) have no hf/ view and inspect says why (asserted, with the reason where
the case names it: ``no_hf_reason``).  mount_tests/modern/test_megatron_hf.py loads the
hf/ views with transformers and compares the logits with the generator's own forward pass.
"""
import json
import math
import os
import shutil
import sys

import pytest
import torch

import helpers as H
from mounting import is_mounted, mounted, run_ckptfs, server_pids

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "gen_megatron"))
import megatron_cases as MC  # noqa: E402

GENERATOR = os.path.join(HERE, "gen_megatron", "generate.py")
ALL = MC.all_cases()
CASES = [c["name"] for c in ALL]
MULTI = [c["name"] for c in ALL if len(c["iterations"]) > 1]
BASE = "llama_tp2_pp2_dp4"          # TP2 PP2: rank dirs mp_rank_TT_PPP
DISTOPT = "distopt_tp2_dp2"         # TP2 PP1 with distrib_optim.pt
OVERLAP = "distopt_overlap_buckets_tp2_dp2"  # distrib_optim.pt of 5000-element gradient buckets (overlap_grad_reduce)
MOE_EP_PP = "moe_seq_ep2_tp1_pp2"   # rank dirs mp_rank_TT_PPP_EEE
MOE_DISTOPT = "moe_distopt_ep2_tp2"  # MoE + distributed optimizer: distrib_optim.pt a list [dense, expert]
WIDE_FC = "gpt_wide_fc_tp2"         # GPT-2-like, 8 MiB fc weights: hf/ transposes them through the tile cache
DIST_BASE = "dist_llama_tp2_pp2"    # torch_dist, world 4: __0_0.distcp .. __3_0.distcp
DIST_DISTOPT = "dist_distopt_tp2_pp2"  # torch_dist with the distributed optimizer's dp_reshardable buckets
TORCH_DIST = {c["name"] for c in ALL if MC.is_torch_dist(c)}
OLD_DISTOPT = {c["name"]: c["distopt_layout"] for c in ALL if c["dist_opt"] and c["distopt_layout"] != "coalesced"}
COMMON_IN_DCP = [c["name"] for c in ALL if MC.is_torch_dist(c) and c["common"] == "dcp"]
DIST_DP = [c["name"] for c in ALL if MC.is_torch_dist(c) and c["dp"] > 1]  # torch_dist with DP replicas
DIST_DP2 = "dist_distopt_tp2_dp2"  # the real TP2 x DP2 save's shape: .metadata's key order is not the model's
SKIP_MODERN = os.environ.get("CKPTFS_SKIP_MODERN") == "1"
GEN_TIMEOUT = 600


def _fixtures_root():
    if os.environ.get("CKPTFS_MEGATRON_FIXTURES"):
        p = os.environ["CKPTFS_MEGATRON_FIXTURES"]
    elif os.environ.get("CKPTFS_FIXTURES"):
        p = os.path.join(os.environ["CKPTFS_FIXTURES"], "megatron")
    else:
        p = os.path.join("build", "fixtures-megatron")
    return p if os.path.isabs(p) else os.path.join(H.REPO, p)


@pytest.fixture(scope="session")
def megatron_fixtures():
    out = _fixtures_root()
    cmd = [sys.executable, GENERATOR, out] + (["--no-torch-dist"] if SKIP_MODERN else [])
    proc = H.run(cmd, timeout=GEN_TIMEOUT)  # cached cases are kept
    H.assert_ok(proc)
    MISSING_WHY.append(proc.stderr.strip())
    return out


MISSING_WHY = []  # the generator's stderr: says why torch_dist cases were skipped


def info_of(root, name):
    if name in TORCH_DIST:
        if SKIP_MODERN:
            pytest.skip("CKPTFS_SKIP_MODERN=1: the torch_dist cases are written by torch 2.6 in the Debian 13 chroot")
        if not os.path.isfile(os.path.join(root, name, "case.json")):
            pytest.fail(f"torch_dist case {name} was not generated (set CKPTFS_SKIP_MODERN=1 to skip these): "
                        f"{' '.join(MISSING_WHY)[-2000:]}", pytrace=False)
    with open(os.path.join(root, name, "case.json")) as f:
        return json.load(f)


def source_of(root, name):
    return os.path.join(root, name, info_of(root, name)["src"])


# ---------------------------------------------------------------------------------------------------
# comparing a folder of views (export dir, mount root, tags/<tag>/) with a case's expectations

def assert_config_fields(ours, exp, what):
    """Every field of ``exp`` is in ``ours`` with the same value (floats to 1e-12 relative)."""
    for k, e in exp.items():
        assert k in ours, f"{what}: no {k!r} (has {sorted(ours)})"
        o = ours[k]
        if isinstance(e, dict):
            assert isinstance(o, dict), f"{what}: {k} is {o!r}, expected {e!r}"
            assert_config_fields(o, e, f"{what}.{k}")
        elif isinstance(e, bool) or e is None or isinstance(e, (str, list)):
            assert o == e and type(o) is type(e), f"{what}: {k} is {o!r}, expected {e!r}"
        else:
            assert isinstance(o, (int, float)) and not isinstance(o, bool), f"{what}: {k} is {o!r}, expected {e!r}"
            assert math.isclose(o, e, rel_tol=1e-12), f"{what}: {k} is {o!r}, expected {e!r}"


def check_views(folder, root, info, tag, what):
    exp = os.path.join(root, info["name"], info["expected"][tag])
    model = H.load_expected(os.path.join(exp, "model.pt"))
    fp32 = H.load_expected(os.path.join(exp, "fp32.pt"))
    H.assert_state_equal(H.read_safetensors(os.path.join(folder, "model.safetensors")), model, False,
                         f"{what}model.safetensors")
    H.assert_state_equal(H.read_safetensors(os.path.join(folder, "fp32", "model.safetensors")), fp32, False,
                         f"{what}fp32/model.safetensors")
    bin_ = torch.load(os.path.join(folder, "fp32", "pytorch_model.bin"), map_location="cpu", weights_only=True)
    assert isinstance(bin_, dict), f"{what}fp32/pytorch_model.bin holds a {type(bin_).__name__}"
    H.assert_state_equal(bin_, fp32, False, f"{what}fp32/pytorch_model.bin")
    if not info["hf"]:  # no Hugging Face family fits (squared ReLU, GeLU + rope ...): no hf/ at all
        assert not os.path.exists(os.path.join(folder, "hf")), \
            f"{what}hf/ exists for a model that fits no Hugging Face family: {sorted(os.listdir(folder))}"
        return
    H.assert_state_equal(H.read_safetensors(os.path.join(folder, "hf", "model.safetensors")),
                         H.load_expected(os.path.join(exp, "hf.pt")), False, f"{what}hf/model.safetensors")
    with open(os.path.join(exp, "hf_config.json")) as f:
        exp_cfg = json.load(f)
    with open(os.path.join(folder, "hf", "config.json")) as f:
        ours = json.load(f)
    assert_config_fields(ours, exp_cfg, f"{what}hf/config.json")
    save_dir = os.path.join(root, info["name"], info["src"])
    for n in info["tokenizer_files"]:
        with open(os.path.join(save_dir, n), "rb") as a, open(os.path.join(folder, "hf", n), "rb") as b:
            assert a.read() == b.read(), f"{what}hf/{n} is not the save dir's {n}"


# ---------------------------------------------------------------------------------------------------
# every case

@pytest.mark.parametrize("name", CASES)
def test_export(name, megatron_fixtures, export_cache):
    info = info_of(megatron_fixtures, name)
    proc, out = export_cache(source_of(megatron_fixtures, name))
    H.assert_ok(proc)
    check_views(str(out), megatron_fixtures, info, info["latest"], "export: ")


@pytest.mark.parametrize("name", CASES)
def test_mount(name, megatron_fixtures, ckptfs_bin, export_cache, tmp_path):
    info = info_of(megatron_fixtures, name)
    src = source_of(megatron_fixtures, name)
    with mounted(ckptfs_bin, src, tmp_path / "mnt") as mnt:
        check_views(mnt, megatron_fixtures, info, info["latest"], "mount: ")
        assert sorted(os.listdir(os.path.join(mnt, "tags"))) == sorted(info["tags"])
        for tag in info["tags"]:
            check_views(os.path.join(mnt, "tags", tag), megatron_fixtures, info, tag, f"mount: tags/{tag}/")
        with open(os.path.join(mnt, "ckptfs.json")) as f:
            assert json.load(f)["root_tag"] == info["latest"]
        proc, out = export_cache(src)
        if proc.returncode == 0:  # the mount serves what export writes
            views = ["model.safetensors", "fp32/model.safetensors", "fp32/pytorch_model.bin"]
            views += ["hf/model.safetensors", "hf/config.json"] if info["hf"] else []
            for v in views:
                with open(os.path.join(mnt, v), "rb") as a, open(os.path.join(out, v), "rb") as b:
                    assert a.read() == b.read(), f"mount {v} differs from export {v}"


def test_hf_transposed_far_above_the_cache(megatron_fixtures, ckptfs_bin, tmp_path):
    """GPT-2's Conv1D weights (hf/) are served transposed through a bounded cache of tiles: mounted with the
    smallest (1 MiB), the 8 MiB fc weights (column- and row-parallel TP slices) are 8x the cache, 32x a tile,
    and every tensor still matches the generator's numpy transpose."""
    info = info_of(megatron_fixtures, WIDE_FC)
    src = source_of(megatron_fixtures, WIDE_FC)
    exp = os.path.join(megatron_fixtures, WIDE_FC, info["expected"][info["latest"]])
    with mounted(ckptfs_bin, src, tmp_path / "mnt", "-o", "transpose_cache_mb=1") as mnt:
        H.assert_state_equal(H.read_safetensors(os.path.join(mnt, "hf", "model.safetensors")),
                             H.load_expected(os.path.join(exp, "hf.pt")), False, "hf/model.safetensors")
    os.makedirs(tmp_path / "mnt0")
    r = run_ckptfs(ckptfs_bin, src, tmp_path / "mnt0", "-o", "transpose_cache_mb=0")
    assert r.returncode == 2 and "transpose_cache_mb=0" in r.stderr, (r.returncode, r.stderr)


@pytest.mark.parametrize("name", MULTI)
def test_export_tag_option(name, megatron_fixtures, export_cache):
    info = info_of(megatron_fixtures, name)
    for tag in info["tags"]:
        proc, out = export_cache(source_of(megatron_fixtures, name), tag)
        H.assert_ok(proc)
        check_views(str(out), megatron_fixtures, info, tag, f"export --tag {tag}: ")


def test_iterations_differ(megatron_fixtures):
    """The multi-iteration cases' iterations hold other values (so the tag tests prove something)."""
    for name in MULTI:
        info = info_of(megatron_fixtures, name)
        a, b = (H.load_expected(os.path.join(megatron_fixtures, name, info["expected"][t], "fp32.pt"))
                for t in info["tags"][:2])
        assert any(H.tensor_bytes(a[k]) != H.tensor_bytes(b[k]) for k in a)


@pytest.mark.parametrize("name", [BASE, MOE_EP_PP, DIST_BASE] + COMMON_IN_DCP)
def test_iteration_dir_as_source(name, megatron_fixtures, export_cache):
    info = info_of(megatron_fixtures, name)
    proc, out = export_cache(os.path.join(source_of(megatron_fixtures, name), info["latest"]))
    H.assert_ok(proc)
    check_views(str(out), megatron_fixtures, info, info["latest"], "export of the iteration dir: ")


@pytest.mark.parametrize("name", CASES)
def test_inspect_json(name, megatron_fixtures, ckptfs_bin):
    info = info_of(megatron_fixtures, name)
    proc = H.run([ckptfs_bin, "inspect", source_of(megatron_fixtures, name), "--json"])
    H.assert_ok(proc)
    try:
        doc = json.loads(proc.stdout)
    except ValueError as e:
        raise AssertionError(f"inspect --json is not JSON ({e}):\n{proc.stdout[:2000]}") from None
    assert doc["framework"] == "megatron", doc.get("framework")
    assert doc["latest"] == info["latest"], doc.get("latest")
    assert [t["name"] for t in doc["tags"]] == info["tags"]
    for t in doc["tags"]:  # a model without hf/ says why
        notes = [n for n in t.get("notes", []) if n.startswith("no hf/ view")]
        if info["hf"]:
            assert not notes, f"tag {t['name']}: {notes}"
        else:
            assert len(notes) == 1, f"tag {t['name']}: no 'no hf/ view' note in {t.get('notes')}"
            assert info["no_hf_reason"] in notes[0], f"tag {t['name']}: {notes[0]!r} does not say {info['no_hf_reason']!r}"


# ---------------------------------------------------------------------------------------------------
# broken checkpoints: exit 4, one line naming the file, nothing mounted

def rank_file(src, tag, rank_dir, name="model_optim_rng.pt"):
    return os.path.join(src, tag, rank_dir, name)


def rewrite(path, change):
    sd = torch.load(path, map_location="cpu")
    change(sd)
    torch.save(sd, path)


def _drop_tensor(sd):
    del sd["model"]["decoder.layers.1.mlp.linear_fc2.weight"]


def _tp_size_4(sd):
    sd["args"].tensor_model_parallel_size = 4


def _narrow_fc2(sd):
    k = "decoder.layers.0.mlp.linear_fc2.weight"
    sd["model"][k] = sd["model"][k][:, :-1].clone()  # row-parallel: the dim-1 pieces no longer tile


def _short_qkv(sd):
    k = "decoder.layers.1.self_attention.linear_qkv.weight"
    sd["model"][k] = sd["model"][k][:-2].clone()


def _wider_norm(sd):
    k = "decoder.layers.0.input_layernorm.weight"
    sd["model"][k] = torch.cat([sd["model"][k], sd["model"][k][:1]])  # replicated: shapes disagree


BROKEN = {
    # (rank dir changed, change): the file is the one the message must name
    "missing tensor": ("mp_rank_01_000", _drop_tensor),
    "args say another TP size": ("mp_rank_01_001", _tp_size_4),
    "row-parallel shard narrower": ("mp_rank_01_000", _narrow_fc2),
    "qkv shard shorter": ("mp_rank_01_001", _short_qkv),
    "replicated norm wider": ("mp_rank_01_000", _wider_norm),
}


def assert_export_and_mount_refused(ckptfs_bin, src, tmp_path, names, code=H.EXIT_INVALID):
    H.assert_one_line_error(H.run([ckptfs_bin, "export", src, tmp_path / "out"]), code, names)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    H.assert_one_line_error(run_ckptfs(ckptfs_bin, src, mnt), code, names)
    assert not is_mounted(mnt) and not server_pids(mnt)


@pytest.fixture
def megatron_copy(megatron_fixtures, tmp_path):
    """copy(name) -> (case info, path of a private copy of that case's save dir)."""
    def copy(name):
        dst = tmp_path / f"src-{name}"
        shutil.copytree(source_of(megatron_fixtures, name), dst)
        return info_of(megatron_fixtures, name), dst
    return copy


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_broken_rank_file(what, ckptfs_bin, megatron_copy, tmp_path):
    info, src = megatron_copy(BASE)
    rank_dir, change = BROKEN[what]
    rewrite(rank_file(src, info["latest"], rank_dir), change)
    assert_export_and_mount_refused(ckptfs_bin, src, tmp_path, [rank_dir])


def test_dp_reshardable_buckets_that_fit_no_layer_split(ckptfs_bin, megatron_copy, tmp_path):
    """torch_dist, dp_reshardable: args that claim tied embeddings over PP2 (so a bucket of its own for the
    embedding) contradict the saved per_bucket_numel_unpadded; the mount is refused naming .metadata."""
    info, src = megatron_copy(DIST_DISTOPT)
    assert info["dist_optim_sharding"] == "dp_reshardable" and not info["tied"] and info["pp"] == 2
    rewrite(os.path.join(src, info["latest"], "common.pt"),
            lambda common: setattr(common["args"], "untie_embeddings_and_output_weights", False))
    assert_export_and_mount_refused(ckptfs_bin, src, tmp_path,
                                    [f"{info['latest']}/.metadata: the distributed optimizer's buffer of stage 0"])


@pytest.mark.parametrize("freq", [0, [1], "([1]*2)"], ids=["zero", "short-list", "python-string"])
def test_moe_layer_freq_megatron_would_refuse(freq, ckptfs_bin, megatron_copy, tmp_path):
    """moe_layer_freq 0, a list that is not one 0/1 per layer (Megatron's gpt_layer_specs asserts both) or a
    pattern string (Megatron evaluates it as Python; ckptfs executes nothing): exit 4 naming the field, not a
    guess at which layers are MoE layers."""
    info, src = megatron_copy("moe_seq_ep1_tp2")
    assert info["layers"] == 2
    for rank_dir in info["rank_dirs"]:
        rewrite(rank_file(src, info["latest"], rank_dir), lambda sd: setattr(sd["args"], "moe_layer_freq", freq))
    assert_export_and_mount_refused(ckptfs_bin, src, tmp_path, ["model_optim_rng.pt", "args.moe_layer_freq"])


# (case, rank dir removed); MoE: EP rank 1 of PP stage 1, whose experts cannot be merged without it
@pytest.mark.parametrize("name,rank_dir", [(BASE, "mp_rank_01_000"), (MOE_EP_PP, "mp_rank_00_001_001")])
def test_missing_rank_dir(name, rank_dir, ckptfs_bin, megatron_copy, tmp_path):
    info, src = megatron_copy(name)
    shutil.rmtree(os.path.join(src, info["latest"], rank_dir))
    assert_export_and_mount_refused(ckptfs_bin, src, tmp_path, [rank_dir])


def test_truncated_rank_file(ckptfs_bin, megatron_copy, tmp_path):
    info, src = megatron_copy(BASE)
    path = rank_file(src, info["latest"], "mp_rank_00_001")
    os.truncate(path, os.path.getsize(path) // 2)
    assert_export_and_mount_refused(ckptfs_bin, src, tmp_path, ["mp_rank_00_001"])


def test_distrib_optim_wrong_size(ckptfs_bin, megatron_copy, tmp_path):
    """distrib_optim.pt whose buffers are 64 elements short of the parameters' layout."""
    info, src = megatron_copy(DISTOPT)
    path = rank_file(src, info["latest"], "mp_rank_01", "distrib_optim.pt")

    def shorten(sd):
        (buf,) = sd[0].values()
        for k in ("param", "exp_avg", "exp_avg_sq"):
            buf[k] = buf[k][:-64].clone()
        buf["numel_unpadded"] -= 64
    rewrite(path, shorten)
    assert_export_and_mount_refused(ckptfs_bin, src, tmp_path, ["distrib_optim.pt"])


def _buffers(sd):
    """[(chunk, dtype key, {'param': ..., 'exp_avg': ..., 'exp_avg_sq': ...})] of a distrib_optim.pt dict."""
    return [(k, key, world) for k, v in sd.items() if isinstance(k, int) for key, world in v.items()]


@pytest.mark.parametrize("name", sorted(OLD_DISTOPT))
def test_older_distrib_optim_fixture_layout(name, megatron_fixtures):
    """The older-era cases hold what they claim (so that the export/mount tests above exercise those layouts):
    core 0.4-0.6 lists of bucket tensors (per_bucket_numel, a (param dtype, grad dtype) key, each bucket padded
    at its end to a multiple of DP; several buckets in a buffer where the case has a tied embedding over
    stages or overlapping gradient reduction) or 2023-05 single buffers (keyed torch.float32, padded to a
    multiple of DP); the padding is never empty in all of a buffer's buckets."""
    info = info_of(megatron_fixtures, name)
    dp, layout = info["dp"], OLD_DISTOPT[name]
    src = source_of(megatron_fixtures, name)
    for rank_dir in info["rank_dirs"]:
        sd = torch.load(rank_file(src, info["latest"], rank_dir, "distrib_optim.pt"), map_location="cpu")
        assert "buckets_coalesced" not in sd
        bufs = _buffers(sd)
        assert [k for k, _, _ in bufs] == list(range(info["vp"]))
        for k, key, world in bufs:
            assert sorted(world) == ["exp_avg", "exp_avg_sq", "param"]
            if layout == "buckets":
                assert key == (torch.bfloat16, torch.float32)
                sizes, unpadded = sd["per_bucket_numel"][k][key], sd["per_bucket_numel_unpadded"][k][key]
                several = info["tied"] and info["pp"] > 1 or info["overlap_grad_reduce"]
                assert (len(sizes) > 1) == several and len(sizes) == len(unpadded), (sizes, several)
                for t in world.values():
                    assert isinstance(t, list) and [b.shape for b in t] == [(n,) for n in sizes]
                assert all(n % dp == 0 and u <= n < u + dp for n, u in zip(sizes, unpadded)), (sizes, unpadded, dp)
                assert any(u < n for n, u in zip(sizes, unpadded)), (sizes, unpadded)
            else:
                assert layout == "padded" and key == torch.float32 and set(sd) == {k for k, _, _ in bufs}
                assert len({t.numel() for t in world.values()}) == 1 and world["param"].numel() % dp == 0


@pytest.mark.parametrize("name", sorted(OLD_DISTOPT))
def test_older_distrib_optim_short(name, ckptfs_bin, megatron_copy, tmp_path):
    """An older-era distrib_optim.pt whose buffers lost their last DP elements (shorter than the parameters)."""
    info, src = megatron_copy(name)
    dp = info["dp"]

    def shorten(sd):
        for k, key, world in _buffers(sd):
            for n in world:
                if isinstance(world[n], list):
                    world[n] = [t[:-dp].clone() for t in world[n]]
                else:
                    world[n] = world[n][:-dp].clone()
            if "per_bucket_numel" in sd:
                sd["per_bucket_numel"][k][key] = [x - dp for x in sd["per_bucket_numel"][k][key]]
    rewrite(rank_file(src, info["latest"], info["rank_dirs"][-1], "distrib_optim.pt"), shorten)
    assert_export_and_mount_refused(ckptfs_bin, src, tmp_path, ["distrib_optim.pt"])


def _single_bucket_total(params, align):
    """Elements of a one-bucket coalesced buffer: params in reverse order, starts aligned up to ``align``."""
    end = 0
    for t in reversed(params):
        end = -(-end // align) * align + t.numel()
    return end


def _gaps_of_single_bucket(params, align=64):
    """Bool mask of a one-bucket coalesced buffer's alignment gaps (params packed in reverse order, 64-aligned)."""
    mask = torch.ones(_single_bucket_total(params, align), dtype=torch.bool)
    end = 0
    for t in reversed(params):
        start = -(-end // align) * align
        mask[start:start + t.numel()] = False
        end = start + t.numel()
    return mask


@pytest.mark.parametrize("fill", ["zeros", "other garbage"])
def test_distrib_optim_gaps_are_never_read(fill, ckptfs_bin, megatron_fixtures, megatron_copy, tmp_path):
    """Legacy DP 2 with the distributed optimizer: the alignment gaps of each distrib_optim.pt buffer hold
    whatever the save left there (the generator: random bit patterns; Megatron's own gather zero-fills them,
    other saves differ), so refilling them changes nothing in the views."""
    info, src = megatron_copy(DISTOPT)
    assert info["dp"] == 2 and not info["overlap_grad_reduce"]
    changed = 0
    for rank_dir in info["rank_dirs"]:
        model = torch.load(rank_file(src, info["latest"], rank_dir), map_location="cpu")["model"]
        mask = _gaps_of_single_bucket([t for k, t in model.items() if not k.endswith("_extra_state")])
        assert mask.any(), rank_dir

        def refill(sd):
            nonlocal changed
            ((_, _, world),) = _buffers(sd)
            for k in ("param", "exp_avg", "exp_avg_sq"):
                assert world[k].numel() == mask.numel(), (k, world[k].numel(), mask.numel())
                new = torch.zeros(int(mask.sum())) if fill == "zeros" else \
                    torch.randint(-2 ** 31, 2 ** 31 - 1, (int(mask.sum()),), dtype=torch.int32).view(torch.float32)
                changed += int((world[k][mask].view(torch.int32) != new.view(torch.int32)).sum())
                world[k][mask] = new
        rewrite(rank_file(src, info["latest"], rank_dir, "distrib_optim.pt"), refill)
    assert changed > 0
    proc = H.run([ckptfs_bin, "export", str(src), str(tmp_path / "out")])
    H.assert_ok(proc)
    check_views(str(tmp_path / "out"), megatron_fixtures, info, info["latest"], f"gaps refilled ({fill}): ")


def test_overlap_buckets_fixture_layout(megatron_fixtures):
    """The overlap_grad_reduce case holds what it claims (so that the export/mount tests above exercise the
    bucketed layout): args with overlap_grad_reduce and 5000-element buckets, PP 1 without VP (Megatron keeps
    one bucket on later stages and chunks), and coalesced buffers whose numel_unpadded fits neither
    single-bucket layout (64-aligned or not)."""
    info = info_of(megatron_fixtures, OVERLAP)
    assert info["pp"] == 1 and info["vp"] == 1 and info["distopt_layout"] == "coalesced"
    src = source_of(megatron_fixtures, OVERLAP)
    for rank_dir in info["rank_dirs"]:
        sd = torch.load(rank_file(src, info["latest"], rank_dir), map_location="cpu")
        args = sd["args"]
        assert args.overlap_grad_reduce is True and args.ddp_bucket_size == 5000 and args.use_distributed_optimizer
        params = [t for k, t in sd["model"].items() if not k.endswith("_extra_state")]
        assert any(t.numel() % 64 for t in params) and sum(t.numel() for t in params) > 4 * 5000
        dist = torch.load(rank_file(src, info["latest"], rank_dir, "distrib_optim.pt"), map_location="cpu")
        assert dist["buckets_coalesced"] is True
        ((_, _, world),) = _buffers(dist)
        n = world["numel_unpadded"]
        assert all(world[k].shape == (n,) for k in ("param", "exp_avg", "exp_avg_sq"))
        assert n not in (_single_bucket_total(params, 64), _single_bucket_total(params, 1)), n


def _overlap_off(sd):
    sd["args"].overlap_grad_reduce = False


def _bucket_size_20000(sd):
    sd["args"].ddp_bucket_size = 20000  # 4 buckets instead of 10: another numel_unpadded


def _default_bucket_size(sd):
    sd["args"].ddp_bucket_size = None  # max(40e6, 1e6 x DP): one bucket


OVERLAP_ARGS = {"overlap_grad_reduce off": _overlap_off, "ddp_bucket_size 20000": _bucket_size_20000,
                "default bucket size": _default_bucket_size}


@pytest.mark.parametrize("what", sorted(OVERLAP_ARGS))
def test_overlap_buckets_args_disagree(what, ckptfs_bin, megatron_copy, tmp_path):
    """The bucketed distrib_optim.pt with args (in every rank file) that give another bucketing: no layout fits
    numel_unpadded, so the masters cannot be placed (the bucket size comes from the args, not from guessing)."""
    info, src = megatron_copy(OVERLAP)
    for rank_dir in info["rank_dirs"]:
        rewrite(rank_file(src, info["latest"], rank_dir), OVERLAP_ARGS[what])
    assert_export_and_mount_refused(ckptfs_bin, src, tmp_path, ["distrib_optim.pt"])


@pytest.mark.parametrize("name", COMMON_IN_DCP)
def test_common_state_fixture_layout(name, megatron_fixtures):
    """core 0.19+ torch_dist: no common.pt, metadata.json without the common backend, the common state a DCP
    bytes item (so that the export/mount tests above read the args from there)."""
    info = info_of(megatron_fixtures, name)
    it = os.path.join(source_of(megatron_fixtures, name), info["latest"])
    assert "common.pt" not in os.listdir(it)
    with open(os.path.join(it, "metadata.json")) as f:
        assert json.load(f) == {"sharded_backend": "torch_dist", "sharded_backend_version": 1}
    with open(os.path.join(it, ".metadata"), "rb") as f:
        assert b"common_state/shard_0_1" in f.read()


MASTERS_SHORT = {
    # (case, rank dir, the fp32_from_fp16_params lists): one fp32 master fewer than the rank's parameters
    "non-distributed optimizer": (BASE, "mp_rank_00_000", lambda opt: opt),
    # the expert optimizer, second of the ChainedOptimizer list
    "MoE expert optimizer": (MOE_EP_PP, "mp_rank_00_000_001", lambda opt: opt[1]),
}


@pytest.mark.parametrize("what", sorted(MASTERS_SHORT))
def test_fp32_masters_missing_a_tensor(what, ckptfs_bin, megatron_copy, tmp_path):
    name, rank_dir, pick = MASTERS_SHORT[what]
    info, src = megatron_copy(name)

    def drop(sd):
        pick(sd["optimizer"])["fp32_from_fp16_params"][0].pop()
    rewrite(rank_file(src, info["latest"], rank_dir), drop)
    assert_export_and_mount_refused(ckptfs_bin, src, tmp_path, [rank_dir])


DIST_BROKEN = {
    # (case, DCP data file) -> what happens to it; in the DP 2 case __2_0 is TP rank 0's DP rank 1, which holds
    # its replica's share of the model and its slices of the optimizer's buckets
    (DIST_BASE, "__1_0.distcp"): os.remove,
    (DIST_BASE, "__2_0.distcp"): lambda path: os.truncate(path, os.path.getsize(path) // 2),
    (DIST_DP2, "__2_0.distcp"): os.remove,
    (DIST_DP2, "__3_0.distcp"): lambda path: os.truncate(path, os.path.getsize(path) // 4),
}


@pytest.mark.parametrize("name,victim", sorted(DIST_BROKEN))
def test_torch_dist_broken_data_file(name, victim, ckptfs_bin, megatron_copy, tmp_path):
    """torch_dist with a .distcp file gone or cut in half."""
    info, src = megatron_copy(name)
    DIST_BROKEN[(name, victim)](os.path.join(src, info["latest"], victim))
    assert_export_and_mount_refused(ckptfs_bin, src, tmp_path, [victim])


# ---------------------------------------------------------------------------------------------------
# MoE with the distributed optimizer: distrib_optim.pt is the ChainedOptimizer's list [dense, expert]

EXPERT_PREFIX = ".mlp.experts."


def test_moe_distrib_optim_fixture_layout(megatron_fixtures):
    """The MoE distributed-optimizer case holds what it claims (so that the export/mount tests above read the
    fp32 masters from the list): in every rank dir distrib_optim.pt is a list of two coalesced states, the dense
    one over the non-expert parameters (None in the EP rank 1 dirs), the expert one over this EP rank's local
    experts, each one buffer whose numel_unpadded is the 64-aligned reverse-order layout of exactly those
    parameters (alignment gaps in both); the optimizer entry is the matching list of param groups; and the
    stored bf16 copy is stale (every fp32 master differs from its upcast bf16 weight)."""
    info = info_of(megatron_fixtures, MOE_DISTOPT)
    assert info["ep"] == 2 and info["dist_opt"] and info["dtype"] == "bf16" and info["stale"]
    assert info["naming"] == "core" and info["distopt_layout"] == "coalesced" and not info["overlap_grad_reduce"]
    src = source_of(megatron_fixtures, MOE_DISTOPT)
    assert sorted(info["rank_dirs"]) == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]
    for rank_dir in info["rank_dirs"]:
        ep = int(rank_dir[-3:])
        sd = torch.load(rank_file(src, info["latest"], rank_dir), map_location="cpu")
        assert sd["args"].use_distributed_optimizer and sd["args"].num_experts == 4
        params = [(k, t) for k, t in sd["model"].items() if not k.endswith("_extra_state")]
        dense = [t for k, t in params if EXPERT_PREFIX not in k]
        expert = [t for k, t in params if EXPERT_PREFIX in k]
        assert len(expert) == 2 * 2 * 2  # 2 layers x 2 local experts x (fc1, fc2)
        opt = sd["optimizer"]
        assert isinstance(opt, list) and len(opt) == 2
        assert [[g["is_expert_parallel"] for g in o["optimizer"]["param_groups"]] for o in opt] == \
            [[False, False], [True]]
        dist = torch.load(rank_file(src, info["latest"], rank_dir, "distrib_optim.pt"), map_location="cpu")
        assert isinstance(dist, list) and len(dist) == 2
        assert (dist[0] is None) == (ep > 0), (rank_dir, type(dist[0]))
        for state, mine in zip(dist, (dense, expert)):
            if state is None:
                continue
            assert state["buckets_coalesced"] is True
            ((k, key, world),) = _buffers(state)
            assert k == 0 and key == (torch.bfloat16, torch.float32)
            n = world["numel_unpadded"]
            assert all(world[x].shape == (n,) for x in ("param", "exp_avg", "exp_avg_sq"))
            assert n == _single_bucket_total(mine, 64) != _single_bucket_total(mine, 1), (rank_dir, n)
    exp = os.path.join(megatron_fixtures, MOE_DISTOPT, info["expected"][info["latest"]])
    model = H.load_expected(os.path.join(exp, "model.pt"))
    fp32 = H.load_expected(os.path.join(exp, "fp32.pt"))
    assert any(EXPERT_PREFIX + "local_experts.3." in k for k in fp32)
    for k, t in model.items():
        assert not torch.equal(t.float(), fp32[k]), f"{k}: the bf16 copy is not stale"


def _moe_state_short(which):
    """Change: list entry ``which`` (0 dense, 1 expert) loses the last 64 elements of its chunk-0 buffer."""
    def change(sd):
        (buf,) = sd[which][0].values()
        for k in ("param", "exp_avg", "exp_avg_sq"):
            buf[k] = buf[k][:-64].clone()
        buf["numel_unpadded"] -= 64
    return change


def _moe_expert_state_gone(sd):
    del sd[1]


def _moe_dense_state_none(sd):
    sd[0] = None


MOE_DISTOPT_BROKEN = {
    # (rank dir, change of its distrib_optim.pt)
    "expert state 64 elements short": ("mp_rank_01_001", _moe_state_short(1)),
    "dense state 64 elements short": ("mp_rank_01_000", _moe_state_short(0)),
    "expert state missing from the list": ("mp_rank_00_001", _moe_expert_state_gone),
    "dense state None in EP rank 0": ("mp_rank_00_000", _moe_dense_state_none),
}


@pytest.mark.parametrize("what", sorted(MOE_DISTOPT_BROKEN))
def test_moe_distrib_optim_broken(what, ckptfs_bin, megatron_copy, tmp_path):
    """A ChainedOptimizer distrib_optim.pt whose dense or expert state cannot hold the masters it must."""
    info, src = megatron_copy(MOE_DISTOPT)
    rank_dir, change = MOE_DISTOPT_BROKEN[what]
    rewrite(rank_file(src, info["latest"], rank_dir, "distrib_optim.pt"), change)
    assert_export_and_mount_refused(ckptfs_bin, src, tmp_path, ["distrib_optim.pt"])


# ---------------------------------------------------------------------------------------------------
# torch_dist at data parallel > 1: the replicas share the writing

def _global_rank(info, t, d, p):
    """Megatron's default rank order tp-cp-ep-dp-pp."""
    return t + info["tp"] * (d + info["dp"] * p)


@pytest.mark.parametrize("name", DIST_DP)
def test_torch_dist_dp_fixture_layout(name, megatron_fixtures):
    """The DP > 1 torch_dist cases hold what they claim (so that the export/mount tests above read masters and
    weights pieced together from every replica's file): one .distcp per rank of TP x DP x PP; model tensors
    written by DP ranks other than 0 too; every dp_reshardable bucket tensor of a domain split over exactly that
    domain's DP replicas' files (each DP rank writes its own slice); in the TP2 x DP2 case .metadata lists
    output_layer.weight before the embedding, which is not the model's order."""
    info = info_of(megatron_fixtures, name)
    tp, dp, pp = info["tp"], info["dp"], info["pp"]
    assert info["dcp_files"] == sorted([".metadata", "common.pt", "metadata.json"] +
                                       [f"__{r}_0.distcp" for r in range(tp * dp * pp)])
    files = info["dcp_chunk_files"]
    replica_files = {f"__{_global_rank(info, t, d, p)}_0.distcp" for t in range(tp) for d in range(1, dp)
                     for p in range(pp)}
    assert any(set(f) & replica_files for k, f in files.items() if not k.startswith("optimizer.")), files
    buckets = [k for k in files if k.startswith("optimizer.distributed.") and k.endswith(".param")]
    assert bool(buckets) == (info["dist_opt"] and info["dist_optim_sharding"] == "dp_reshardable")
    for key in buckets:
        i = int(key.split(".")[2][len("dp_group_idx_"):])
        p, t = divmod(i, tp)
        assert files[key] == sorted(f"__{_global_rank(info, t, d, p)}_0.distcp" for d in range(dp)), (key, files[key])
    if name == DIST_DP2:
        order = info["dcp_tensor_order"]
        assert order.index("output_layer.weight") < order.index("embedding.word_embeddings.weight"), order


# (tracker text, exit code, what the root serves); two_iters_tp2 holds iter_0000002 and iter_0000005
TRACKERS = {
    "leading zeros": ("0000000000000000000005\n", 0, "iter_0000005"),
    "oversized number": ("9" * 40, H.EXIT_INVALID, None),
    "200,000 digits": ("7" * 200_000, H.EXIT_INVALID, None),  # std::regex overflowed its stack on it
    "not a number": ("iter_5", H.EXIT_INVALID, None),
    "empty": (" \n", H.EXIT_INVALID, None),
}


@pytest.mark.parametrize("what", sorted(TRACKERS))
def test_tracker_text(what, ckptfs_bin, megatron_copy, tmp_path):
    """latest_checkpointed_iteration.txt as Megatron reads it (int() of the stripped text, dir iter_%07d): leading
    zeros are fine; a number too long for any integer type names a dir that is missing (exit 4, like any other
    missing target), as does text that is no number."""
    text, code, root = TRACKERS[what]
    _, src = megatron_copy("two_iters_tp2")
    with open(os.path.join(src, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(text)
    if code:
        assert_export_and_mount_refused(ckptfs_bin, src, tmp_path, ["latest_checkpointed_iteration.txt"], code)
        return
    proc = H.run([ckptfs_bin, "inspect", str(src), "--json"])
    H.assert_ok(proc)
    assert json.loads(proc.stdout)["latest"] == root
