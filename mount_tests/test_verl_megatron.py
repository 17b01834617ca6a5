"""verl's Megatron backend (volcengine/verl b178a3cd5, verl/utils/checkpoint/megatron_checkpoint_manager.py): a run
dir of global_step_N/ dirs and verl's tracker; per role (actor, critic) dist_ckpt/ (Megatron's torch_dist save, no
Megatron args in it), transformer_config.json (rank 0's dump of the TransformerConfig) and huggingface/ (the HF config
and tokenizer).

The files: dist_ckpt/ holds the real Megatron-Bridge Qwen3 save's DCP files (mount_tests/fixtures/megatron-2026-real,
shared_bridge_qwen3_pretrain_tp2: TP2, distributed optimizer), whose model keys are the ones verl's save of the same
model writes (both save GPTModel.sharded_state_dict() through megatron-core's dist_checkpointing);
transformer_config.json and huggingface/ were written by mount_tests/modern/chroot_verl_megatron_config.py
(megatron-core core_v0.13.1's TransformerConfig of that model dumped as verl dumps it; transformers' save_pretrained
of its HF config and tokenizer) into fixtures/megatron-2026-real/verl_megatron_layout/actor/.

Here: every entry point finds the step (run dir, step dir, actor/, dist_ckpt/), model.safetensors is Bridge's own TP=1
load under TransformerEngine's names (verl's TransformerConfig says nothing of the layer spec; verl always builds the
TE spec), hf/ the golden HF model with huggingface/'s config and tokenizer; inspect names verl, its config files, the
family and the critic left out; a broken or missing config file is exit 4 naming it; a live mount serves a
new step once verl's tracker names it.  The Bridge run's optimizer buckets follow its local spec's parameter order,
which no verl run has, so fp32/ is not checked on these files; mount_tests/modern/test_verl_megatron_weights.py mounts
the save verl writes without the optimizer (no fp32/) and runs from_pretrained on it (it needs the sid chroot).
"""

import json
import os
import shutil

import pytest

import helpers as H
from test_live_run import assert_not_served, listed, mount, mount_info, poll
from test_real_megatron import load_json
from test_real_megatron_2026 import BRIDGE_QWEN3, TAG, case_path, check_hf

VERL_FILES = os.path.join(H.HERE, "fixtures", "megatron-2026-real", "verl_megatron_layout", "actor")
STEP = "global_step_3"
# TransformerEngine's names of the norms the local spec keeps as modules of their own
TE_NAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
            "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}


def bridge_dcp_files(dst):
    """The real Bridge save's DCP files (without Bridge's run_config.yaml, train_state.pt and tokenizer/)."""
    iteration = case_path(BRIDGE_QWEN3, "checkpoint", TAG)
    os.makedirs(dst)
    for f in os.listdir(iteration):
        if f.endswith(".distcp") or f in (".metadata", "metadata.json"):
            shutil.copy(os.path.join(iteration, f), os.path.join(dst, f))


def verl_run_dir(run, dist_ckpt=None):
    """checkpoints/<project>/<experiment> as verl writes it: global_step_3/{actor,critic}/ each with dist_ckpt/ (a
    copy of `dist_ckpt`, else the Bridge save's DCP files), transformer_config.json and huggingface/; verl's tracker."""
    for role in ("actor", "critic"):
        role_dir = os.path.join(run, STEP, role)
        if dist_ckpt:
            shutil.copytree(dist_ckpt, os.path.join(role_dir, "dist_ckpt"))
        else:
            bridge_dcp_files(os.path.join(role_dir, "dist_ckpt"))
        shutil.copytree(VERL_FILES, role_dir, dirs_exist_ok=True)
    with open(os.path.join(run, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("3")
    return run


def entry_points(run):
    actor = os.path.join(run, STEP, "actor")
    return [("run dir", run), ("step dir", os.path.join(run, STEP)), ("actor dir", actor),
            ("dist_ckpt", os.path.join(actor, "dist_ckpt"))]


def te_named(name):
    for local, te in TE_NAMES.items():
        if name.endswith("." + local):
            return name[: -len(local)] + te
    return name


def check_model_and_hf(d, what):
    """model.safetensors against Bridge's own TP=1 load under TE names, hf/ against the golden HF model."""
    model = H.read_safetensors(os.path.join(d, "model.safetensors"))
    full = H.load_expected(case_path(BRIDGE_QWEN3, "expected", "full_model.pt"))
    H.assert_state_equal(model, {te_named(k): v for k, v in full.items()}, ordered=False,
                         what=f"{what} model.safetensors vs Bridge's TP=1 load (TE names)")
    check_hf(d, BRIDGE_QWEN3, what)


def check_verl_views(d, what):
    """A step saved without the optimizer: the model and hf/, no fp32/, and verl's own files passed through."""
    check_model_and_hf(d, what)
    assert not os.path.exists(os.path.join(d, "fp32")), f"{what}: fp32/ without saved masters"
    hf_files = os.path.join(VERL_FILES, "huggingface")
    for f in os.listdir(hf_files):  # config.json and the tokenizer as verl saved them
        with open(os.path.join(hf_files, f), "rb") as ref, open(os.path.join(d, "hf", f), "rb") as ours:
            assert ours.read() == ref.read(), f"{what}: hf/{f} differs from huggingface/{f}"
    with open(os.path.join(VERL_FILES, "transformer_config.json"), "rb") as ref, \
            open(os.path.join(d, "transformer_config.json"), "rb") as ours:
        assert ours.read() == ref.read(), f"{what}: transformer_config.json differs from verl's"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return verl_run_dir(str(tmp_path_factory.mktemp("verl") / "run"))


@pytest.mark.parametrize("entry", range(4), ids=["run dir", "step dir", "actor dir", "dist_ckpt"])
def test_every_entry_point_serves_the_step(export_cache, run_dir, entry):
    label, src = entry_points(run_dir)[entry]
    proc, out = export_cache(src)
    H.assert_ok(proc)
    check_model_and_hf(str(out), f"verl {label} export")


def test_inspect_names_verl_its_config_files_and_the_family(ckptfs_bin, run_dir):
    proc = H.run([ckptfs_bin, "inspect", run_dir, "--json"])
    H.assert_ok(proc)
    info = json.loads(proc.stdout)
    assert info["framework"] == "megatron", info
    [t] = info["tags"]
    assert t["name"] == STEP, t
    assert t["format"] == ("verl Megatron checkpoint (dist_ckpt/ torch_dist; model config: transformer_config.json "
                           "and huggingface/config.json)"), t["format"]
    config = load_json(os.path.join(VERL_FILES, "transformer_config.json"))
    assert (t["topology"]["tp"], t["topology"]["pp"]) == (config["tensor_model_parallel_size"],
                                                          config["pipeline_model_parallel_size"]), t["topology"]
    assert "hf/: the model as Hugging Face's Qwen3ForCausalLM (qwen3)" in t["notes"], t["notes"]
    critic = os.path.join(run_dir, STEP, "critic")
    assert f"critic/ not served: mount {critic} itself to read it" in t["notes"], t["notes"]


def replace_in(path, old, new):
    with open(path) as f:
        text = f.read()
    assert old in text, (path, old)
    with open(path, "w") as f:
        f.write(text.replace(old, new))


@pytest.mark.parametrize("change, problem", [
    (lambda role: open(os.path.join(role, "transformer_config.json"), "w").write("{not json"),
     ["transformer_config.json", "not YAML"]),
    (lambda role: replace_in(os.path.join(role, "transformer_config.json"), '"num_layers": 4', '"num_layers": null'),
     ["transformer_config.json", "num_layers: missing"]),
    (lambda role: replace_in(os.path.join(role, "transformer_config.json"), '"hidden_size": 64', '"hidden_size": "x"'),
     ["transformer_config.json", "hidden_size: expected an integer"]),
    (lambda role: os.unlink(os.path.join(role, "huggingface", "config.json")), ["huggingface/config.json", "missing"]),
    (lambda role: open(os.path.join(role, "huggingface", "config.json"), "w").write('{"vocab_size": 256}'),
     ["huggingface/config.json", "max_position_embeddings is missing"]),
], ids=["not JSON", "field missing", "field of the wrong type", "no HF config", "HF field missing"])
def test_broken_config_is_exit_4_naming_the_file(ckptfs_bin, tmp_path, change, problem):
    run = verl_run_dir(str(tmp_path / "run"))
    change(os.path.join(run, STEP, "actor"))
    proc = H.run([ckptfs_bin, "inspect", run])
    H.assert_one_line_error(proc, H.EXIT_INVALID, [problem[0]])
    assert problem[1] in proc.stderr, proc.stderr


def test_live_mount_serves_a_step_once_the_tracker_names_it(ckptfs_bin, tmp_path):
    """verl writes a step's dist_ckpt/, then rank 0's huggingface/ and transformer_config.json, then its tracker: a
    live mount holds a new global_step_N/ back (in progress) until the tracker names it, then serves it at the root."""
    run = verl_run_dir(str(tmp_path / "run"))
    with mount(ckptfs_bin, run, tmp_path / "mnt") as mnt:
        assert listed(mnt) == {STEP}
        shutil.copytree(os.path.join(run, STEP), os.path.join(run, "global_step_6"))
        assert_not_served(mnt, "global_step_6", "a step the tracker does not name yet", in_progress=True)
        with open(os.path.join(run, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write("6")
        poll(lambda: mount_info(mnt)["root_tag"] == "global_step_6" and listed(mnt) == {STEP, "global_step_6"},
             "global_step_6 served at the root once the tracker names it", mnt=mnt)
        check_model_and_hf(os.path.join(mnt, "tags", "global_step_6"), "verl live mount global_step_6")
