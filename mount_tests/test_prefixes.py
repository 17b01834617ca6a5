"""Wrapper prefixes (issue 31): a training framework that hands DeepSpeed or FSDP a module holding the Hugging Face
model saves the HF names under that module's attribute path; ckptfs takes the prefix off where config.json
(the tag dir's, else the save dir's) names an architecture it knows, or where `-o strip_prefix=P` /
`--strip-prefix P` says which.  Every expectation comes from the generators (their own tensors under the HF
model's names), never from ckptfs.

- DeepSpeed (mount_tests/gen/generate.py prefix_cases, cached with the other generated cases): the tiny Llama of
  llama_z3_bf16_dp2 as PyTorch Lightning's DeepSpeedStrategy saves it (ModelCheckpoint's
  `epoch=0-step=3.ckpt/` save dir, `latest` -> `checkpoint`, Lightning's state as DeepSpeed's client state)
  under `model.` (Lightning >= 2.1, ZeRO-2, a frozen embedding), `_forward_module.model.` (1.8-2.0, ZeRO-3, tied
  lm_head, a frozen norm) and `module.model.` (<= 1.7, ZeRO-1 fp16), config.json in the save dir; and
  OpenRLHF's actor (`_actor/global_step{2,4}/`, `metric.json`; the HF model itself goes to DeepSpeed, so no
  prefix, and its config.json is in `global_step4_hf/`, not beside the DeepSpeed save).
- Lightning's FSDPStrategy(state_dict_type="sharded") (mount_tests/gen_prefixes/generate_lightning_fsdp.py: real
  torch 2.14 FSDP and torch.distributed.checkpoint in the Debian unstable chroot, cached in
  ${CKPTFS_PREFIX_FIXTURES:-build/fixtures-prefixes}): a DCP dir of `{"model", "optimizer_0"}` plus rank 0's
  `meta.pt`, names `model.` + HF under DCP's `model`; expectation FSDP's own FULL_STATE_DICT.
Checked: model.safetensors and fp32/ bit for bit under the HF names at the root and under tags/, side files
unchanged, `inspect`'s note, universal/ keeping DeepSpeed's names (what DeepSpeed loads back into the wrapper),
the same mount with `-o strip_prefix` and without config.json (the names keep the prefix, nothing said), and
transformers' `from_pretrained` of the mount in ${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid}.
"""
import collections
import filecmp
import hashlib
import json
import os
import shutil
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("gen_dcp", "gen_prefixes", "modern"):
    sys.path.insert(0, os.path.join(HERE, sub))
import helpers as H  # noqa: E402
import test_universal as TU  # noqa: E402 (the universal/ tree against the generator's expectation)
from conftest import case_info, generate_only  # noqa: E402
from mounting import mounted  # noqa: E402
from test_mount import VIEWS, assert_view_holds, expected_views  # noqa: E402
from test_modern_clients import chroot_versions, in_chroot, staged  # noqa: E402,F401 (staged: a fixture)

import generate  # noqa: E402 (on the path through helpers)
import generate_lightning_fsdp as GL  # noqa: E402
import run_generator as RG  # noqa: E402

SID = os.path.abspath(os.environ.get("CKPTFS_SID_CHROOT", "/var/cache/ckptfs/sid"))
SKIP_MODERN = os.environ.get("CKPTFS_SKIP_MODERN") == "1"
CASES = {c["name"]: c for c in generate.prefix_cases()}
LIGHTNING = [n for n, c in CASES.items() if c.get("client") == "lightning"]
OPENRLHF = "openrlhf_z2_bf16_dp2"
FSDP = "lightning_fsdp_sharded_ws2"
FSDP_SUITE = RG.Suite("generate_lightning_fsdp.py",
                      tuple(os.path.join(HERE, *p) for p in (("gen_prefixes", "generate_lightning_fsdp.py"),
                                                             ("gen_prefixes", "lightning_state.py"),
                                                             ("gen_dcp", "generate_dcp.py"), ("gen_dcp", "dcp_cases.py"),
                                                             ("case_cache.py",), ("llama_layout.py",))),
                      GL.CASES, GL.GEN_VERSION)
CLIENT = [os.path.join(HERE, "gen_prefixes", "chroot_from_pretrained.py"),
          os.path.join(HERE, "device", "check_hf_load.py")]


def note(prefix, explicit=False):
    """inspect's note for a stripped prefix."""
    who = "-o strip_prefix" if explicit else "config.json's architecture"
    return f"stripped the wrapper prefix '{prefix}' from the model's names ({who})"


def inspect_notes(ckptfs_bin, src, *args):
    """Every tag's notes, from `ckptfs inspect --json`."""
    proc = H.run([ckptfs_bin, "inspect", src, "--json", *args])
    H.assert_ok(proc)
    return {t["name"]: t.get("notes", []) for t in json.loads(proc.stdout)["tags"]}


def prefixed(views, prefix):
    """The expected views with the wrapper's prefix put back on every name (what a mount that strips nothing
    serves)."""
    return {v: (collections.OrderedDict((prefix + k, t) for k, t in want.items()), ordered)
            for v, (want, ordered) in views.items()}


def assert_views(root, expected, views=VIEWS):
    for v in views:
        with open(os.path.join(root, v), "rb") as f:
            assert_view_holds(v, f.read(), expected)


def copy_tree(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def without_config(src, dst):
    """A copy of the save dir `src` without its config.json, and that config.json's path."""
    copy_tree(src, dst)
    os.unlink(os.path.join(dst, "config.json"))
    return str(dst), os.path.join(src, "config.json")


# ----------------------------------------------------------------------------------------------------
# DeepSpeed: Lightning's and OpenRLHF's saves

@pytest.fixture(scope="module")
def ds_fixtures():
    return generate_only(list(CASES))


def source_of(fixtures, name):
    return os.path.join(fixtures, name, case_info(fixtures, name)["src"])


def test_generator_writes_the_prefix_everywhere(ds_fixtures):
    """No ckptfs: every name DeepSpeed records (module, param_shapes, frozen_param_shapes and fragments,
    shared_params, param_slice_mappings) carries the wrapper's prefix and is an HF name behind it, the client
    state is the framework's, and the tests' own pure-Python merge (helpers.reference_merge) of the prefixed
    files gives the generator's expectation with the prefix put back."""
    for name, case in CASES.items():
        info, p = case_info(ds_fixtures, name), case["prefix"]
        src = source_of(ds_fixtures, name)
        for tag in info["tags"]:
            d = os.path.join(src, tag)
            views = expected_views(ds_fixtures, info, tag)
            hf_names = set(views["model.safetensors"][0])
            names = set()
            for f in sorted(os.listdir(d)):
                if not f.endswith(".pt"):
                    continue
                sd = H._load(os.path.join(d, f))
                if "module" in sd:
                    names |= set(sd["module"]) | {n for g in sd["param_shapes"] for n in g}
                    names |= set(sd["frozen_param_shapes"] or ()) | set(sd["frozen_param_fragments"] or ())
                    names |= {n for kv in (sd["shared_params"] or {}).items() for n in kv}
                    if case.get("client") == "lightning":
                        assert sd["pytorch-lightning_version"] == case["lightning_version"], f
                        assert "state_dict" not in sd and "optimizer_states" not in sd, f
                    else:
                        assert {"episode", "data_loader_state_dict"} <= set(sd), f
                else:
                    for m in sd["optimizer_state_dict"].get("param_slice_mappings", ()):
                        names |= set(m)
            outside = sorted(n for n in names if not n.startswith(p))
            assert not outside, f"{name}/{tag}: names without the prefix {p!r}: {outside}"
            assert {n[len(p):] for n in names} == hf_names, f"{name}/{tag}: {sorted(names)}"
            fp32, model = H.reference_merge(src, tag)
            want = prefixed(views, p)
            H.assert_state_equal(model, want["model.safetensors"][0], False, f"{name}/{tag} reference merge, model")
            H.assert_state_equal(fp32, want["fp32/pytorch_model.bin"][0], True, f"{name}/{tag} reference merge, fp32")


@pytest.mark.parametrize("name", list(CASES))
def test_mount_serves_the_hf_names(ds_fixtures, ckptfs_bin, tmp_path, name):
    info, case = case_info(ds_fixtures, name), CASES[name]
    src = source_of(ds_fixtures, name)
    with mounted(ckptfs_bin, src, tmp_path / "mnt") as mnt:
        assert_views(mnt, expected_views(ds_fixtures, info))
        assert sorted(os.listdir(os.path.join(mnt, "tags"))) == sorted(info["tags"])
        for tag in info["tags"]:
            assert_views(os.path.join(mnt, "tags", tag), expected_views(ds_fixtures, info, tag))
        sides = ["config.json", "tokenizer.json"] if case["side_files"] else []
        for n in sides:
            assert filecmp.cmp(os.path.join(src, n), os.path.join(mnt, n), shallow=False), n
        assert set(os.listdir(mnt)) == {"model.safetensors", "fp32", "universal", "tags", "ckptfs.json", *sides}
    want = [note(case["prefix"])] if case["prefix"] else []
    notes = inspect_notes(ckptfs_bin, src)
    assert {t: [n for n in ns if "prefix" in n] for t, ns in notes.items()} == {t: want for t in info["tags"]}, notes


@pytest.mark.parametrize("name", list(CASES))
def test_universal_keeps_deepspeeds_names(ds_fixtures, ckptfs_bin, tmp_path, name):
    """universal/ is for DeepSpeed to load back into the same wrapper: its zero/<param>/ folders keep the
    prefixed names, every file as the generator expects."""
    info = case_info(ds_fixtures, name)
    src = source_of(ds_fixtures, name)
    with mounted(ckptfs_bin, src, tmp_path / "mnt") as mnt:
        for where, tag in TU.locations(info):
            exp = TU.Expect(ds_fixtures, name, tag)
            exp.tag_dir = os.path.join(src, tag)
            assert all(n.startswith(CASES[name]["prefix"]) for n in exp.params)
            files, dirs = TU.walk(os.path.join(mnt, where))
            want_files, want_dirs = exp.file_set()
            TU.assert_set_equal(files, want_files, f"{where} files")
            TU.assert_set_equal(dirs, want_dirs, f"{where} dirs")
            TU.check_generated_tree(os.path.join(mnt, where), exp)


@pytest.mark.parametrize("name", LIGHTNING)
def test_without_config_json_the_names_keep_the_prefix(ds_fixtures, ckptfs_bin, tmp_path, name):
    """No config.json: nothing tells the architecture, so nothing is stripped and nothing is said; `-o
    strip_prefix=P` (and export's --strip-prefix) then gives the HF names, with the note saying who asked."""
    info, p = case_info(ds_fixtures, name), CASES[name]["prefix"]
    src, _ = without_config(source_of(ds_fixtures, name), tmp_path / "epoch=0-step=3.ckpt")
    hf = expected_views(ds_fixtures, info)
    with mounted(ckptfs_bin, src, tmp_path / "mnt") as mnt:
        assert_views(mnt, prefixed(hf, p))
    assert not [n for ns in inspect_notes(ckptfs_bin, src).values() for n in ns if "prefix" in n]
    with mounted(ckptfs_bin, src, tmp_path / "mnt", "-o", f"strip_prefix={p}") as mnt:
        assert_views(mnt, hf)
        assert_views(os.path.join(mnt, "tags", "checkpoint"), hf)
    assert inspect_notes(ckptfs_bin, src, "--strip-prefix", p)["checkpoint"][-1] == note(p, explicit=True)
    proc = H.run([ckptfs_bin, "export", src, tmp_path / "out", "--strip-prefix", p])
    H.assert_ok(proc)
    assert_views(tmp_path / "out", hf)


@pytest.mark.parametrize("name", LIGHTNING)
def test_explicit_strip_prefix_gives_the_same_mount(ds_fixtures, ckptfs_bin, tmp_path, name):
    """With config.json, `-o strip_prefix=P` naming the prefix ckptfs finds serves the same bytes."""
    src, p = source_of(ds_fixtures, name), CASES[name]["prefix"]
    served = {}
    for how, opts in (("found", ()), ("given", ("-o", f"strip_prefix={p}"))):
        with mounted(ckptfs_bin, src, tmp_path / f"mnt-{how}", *opts) as mnt:
            for v in VIEWS:
                with open(os.path.join(mnt, v), "rb") as f:
                    served[how, v] = f.read()
    expected = expected_views(ds_fixtures, case_info(ds_fixtures, name))
    for v in VIEWS:
        assert served["found", v] == served["given", v], v
        assert_view_holds(v, served["given", v], expected)


def test_config_json_in_the_tag_dir(ds_fixtures, ckptfs_bin, tmp_path):
    """The tag dir's config.json serves as well as the save dir's."""
    name = "lightning_z2_bf16_dp2"
    src = copy_tree(source_of(ds_fixtures, name), tmp_path / "epoch=0-step=3.ckpt")
    os.rename(os.path.join(src, "config.json"), os.path.join(src, "checkpoint", "config.json"))
    with mounted(ckptfs_bin, src, tmp_path / "mnt") as mnt:
        assert_views(mnt, expected_views(ds_fixtures, case_info(ds_fixtures, name)))
    assert note("model.") in inspect_notes(ckptfs_bin, src)["checkpoint"]


def openrlhf_with_config(fixtures, tmp_path):
    """OpenRLHF's `_actor/` with the config and tokenizer of save_model's `global_step4_hf/` copied in, as a user
    who wants to load the DeepSpeed save does."""
    src = copy_tree(source_of(fixtures, OPENRLHF), tmp_path / "_actor")
    hf = os.path.join(fixtures, OPENRLHF, CASES[OPENRLHF]["hf_dir"])
    for n in ("config.json", "tokenizer.json"):
        shutil.copy(os.path.join(hf, n), src)
    return src


def test_openrlhf_names_need_no_stripping(ds_fixtures, ckptfs_bin, tmp_path):
    """Already the architecture's names: with config.json beside them nothing is stripped or said."""
    src = openrlhf_with_config(ds_fixtures, tmp_path)
    info = case_info(ds_fixtures, OPENRLHF)
    with mounted(ckptfs_bin, src, tmp_path / "mnt") as mnt:
        for tag in info["tags"]:
            assert_views(os.path.join(mnt, "tags", tag), expected_views(ds_fixtures, info, tag))
    assert not [n for ns in inspect_notes(ckptfs_bin, src).values() for n in ns if "prefix" in n]


# ----------------------------------------------------------------------------------------------------
# Lightning's FSDPStrategy(state_dict_type="sharded"): a DCP dir and meta.pt

@pytest.fixture(scope="module")
def fsdp_fixtures():
    if SKIP_MODERN:
        pytest.skip("CKPTFS_SKIP_MODERN=1: the case is written by torch 2.14 in the Debian unstable chroot")
    if not RG.chroot_ready(SID):
        pytest.fail(f"the Debian unstable chroot (torch 2.14) is not set up ({SID}/.ckptfs-chroot-complete "
                    f"missing): point CKPTFS_SID_CHROOT at one (or set CKPTFS_SKIP_MODERN=1)", pytrace=False)
    out = os.environ.get("CKPTFS_PREFIX_FIXTURES", os.path.join(H.REPO, "build", "fixtures-prefixes"))
    try:
        RG.generate(out, SID, suite=FSDP_SUITE)
    except RuntimeError as e:
        pytest.fail(f"generate_lightning_fsdp.py failed: {e}", pytrace=False)
    return out


def fsdp_case(fixtures):
    info = case_info(fixtures, FSDP)
    load = lambda k: H.load_expected(os.path.join(fixtures, FSDP, info["expected"][k]))  # noqa: E731
    views = {"model.safetensors": (load("model"), False), "fp32/model.safetensors": (load("fp32"), False),
             "fp32/pytorch_model.bin": (load("fp32"), False)}
    return info, os.path.join(fixtures, FSDP, info["src"]), views


def test_lightning_fsdp_case_is_what_lightning_writes(fsdp_fixtures):
    """The generator's own record: ShardedTensors (FSDP1 SHARDED_STATE_DICT), `{"model", "optimizer_0"}`, read
    back by PyTorch's dcp_to_torch_save to FULL_STATE_DICT's tensors; meta.pt Lightning's state."""
    info, src, _ = fsdp_case(fsdp_fixtures)
    assert info["readback_equal"] and info["top_level_keys"] == ["model", "optimizer_0"], info
    assert info["sharded_state_dict_types"] == ["torch.distributed._shard.sharded_tensor.api.ShardedTensor"]
    assert set(info["files"]) == {".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt", "config.json"}
    meta = torch.load(os.path.join(src, "meta.pt"), weights_only=False)  # floats: torch 1.13 refuses them
    assert meta["global_step"] == 3 and "state_dict" not in meta and "optimizer_states" not in meta, sorted(meta)


def test_lightning_fsdp_mount(fsdp_fixtures, ckptfs_bin, tmp_path):
    info, src, hf = fsdp_case(fsdp_fixtures)
    with mounted(ckptfs_bin, src, tmp_path / "mnt") as mnt:
        assert_views(mnt, hf)
        for n in ("meta.pt", "config.json"):
            assert filecmp.cmp(os.path.join(src, n), os.path.join(mnt, n), shallow=False), n
        with open(os.path.join(mnt, "meta.pt"), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == info["meta_pt"]["sha256"]
        # full_state.pt is dcp_to_torch_save's output: DCP's own names, nothing stripped
        full = torch.load(os.path.join(mnt, "full_state.pt"), map_location="cpu", weights_only=False)
        H.assert_state_equal(full["model"], prefixed(hf, info["prefix"])["model.safetensors"][0], False, "full_state")
    notes = inspect_notes(ckptfs_bin, src)
    assert [n for ns in notes.values() for n in ns if "prefix" in n] == [note(info["prefix"])], notes


def test_lightning_fsdp_without_config_json(fsdp_fixtures, ckptfs_bin, tmp_path):
    """The LightningModule's names (`model.` + HF) without config.json; the HF names with `-o strip_prefix`."""
    info, src, hf = fsdp_case(fsdp_fixtures)
    src, _ = without_config(src, tmp_path / "epoch=0-step=3.ckpt")
    with mounted(ckptfs_bin, src, tmp_path / "mnt") as mnt:
        assert_views(mnt, prefixed(hf, info["prefix"]))
        assert filecmp.cmp(os.path.join(src, "meta.pt"), os.path.join(mnt, "meta.pt"), shallow=False)
    assert not [n for ns in inspect_notes(ckptfs_bin, src).values() for n in ns if "prefix" in n]
    with mounted(ckptfs_bin, src, tmp_path / "mnt", "-o", f"strip_prefix={info['prefix']}") as mnt:
        assert_views(mnt, hf)


# ----------------------------------------------------------------------------------------------------
# -o config=FILE: the architecture from a config.json given on the command line

@pytest.fixture(params=["lightning_z2_bf16_dp2", FSDP])
def config_option_case(request, tmp_path):
    """(save dir without config.json, the config.json, expected views) of a Lightning DeepSpeed case and of the
    Lightning FSDP case."""
    name = request.param
    if name == FSDP:
        _, src, hf = fsdp_case(request.getfixturevalue("fsdp_fixtures"))
    else:
        fixtures = request.getfixturevalue("ds_fixtures")
        src, hf = source_of(fixtures, name), expected_views(fixtures, case_info(fixtures, name))
    return (*without_config(src, tmp_path / "epoch=0-step=3.ckpt"), hf)


def test_config_option_tells_the_architecture(config_option_case, ckptfs_bin, tmp_path):
    """`-o config=FILE` / `--config FILE` (no config.json beside the save) finds and strips the prefix as a
    config.json beside it would."""
    src, config, hf = config_option_case
    with mounted(ckptfs_bin, src, tmp_path / "mnt", "-o", f"config={config}") as mnt:
        assert_views(mnt, hf)
    notes = inspect_notes(ckptfs_bin, src, "--config", config)
    assert [n for ns in notes.values() for n in ns if "prefix" in n] == [note("model.")], notes


def test_config_option_file_is_served_as_config_json(config_option_case, ckptfs_bin, tmp_path):
    """docs/mount.md: the FILE of `-o config=FILE` is served as config.json (so that from_pretrained(MNT) works)."""
    src, config, _ = config_option_case
    with mounted(ckptfs_bin, src, tmp_path / "mnt", "-o", f"config={config}") as mnt:
        assert filecmp.cmp(config, os.path.join(mnt, "config.json"), shallow=False)


# ----------------------------------------------------------------------------------------------------
# transformers from_pretrained of the mount (the sid chroot)

@pytest.fixture(scope="session")
def chroot_dir():
    """The sid chroot (the `staged` fixture stages there): (root, versions or None)."""
    if SKIP_MODERN:
        pytest.skip("CKPTFS_SKIP_MODERN=1")
    return SID, chroot_versions(SID)


FROM_PRETRAINED = [*LIGHTNING, OPENRLHF, FSDP]


@pytest.mark.parametrize("name", FROM_PRETRAINED)
def test_from_pretrained_of_the_mount(request, chroot_dir, staged, ckptfs_bin, tmp_path, name):
    root, versions = chroot_dir
    if (versions or {}).get("transformers", "absent") == "absent":
        pytest.fail(f"{root} is not a Debian unstable chroot with transformers (stamp: {versions}): run "
                    f"`CKPTFS_CHROOT={root} CKPTFS_CHROOT_SUITE=sid bash mount_tests/modern/setup_chroot.sh`",
                    pytrace=False)
    if name == FSDP:
        fixtures = request.getfixturevalue("fsdp_fixtures")
        info, src, _ = fsdp_case(fixtures)
        expected = os.path.join(fixtures, FSDP, info["expected"]["model"])
    else:
        fixtures = request.getfixturevalue("ds_fixtures")
        info = case_info(fixtures, name)
        src = openrlhf_with_config(fixtures, tmp_path) if name == OPENRLHF else source_of(fixtures, name)
        expected = os.path.join(fixtures, name, info["expected"][info["latest"]], "model.pt")
    _, inside, mnt, mnt_inside = staged(f"prefix-{name}", *CLIENT, expected)
    with mounted(ckptfs_bin, src, mnt):
        proc = in_chroot(root, "python3", f"{inside}/chroot_from_pretrained.py", mnt_inside, f"{inside}/model.pt")
    print(proc.stdout, end="")
    assert proc.returncode == 0 and proc.stdout.count("PASS ") == 3, H.describe(proc)
