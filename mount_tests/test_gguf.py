"""The gguf/ view (issue 33, docs/formats/gguf.md) against llama.cpp's own converter, in the Debian unstable
chroot (llama.cpp-tools 0.7.0, python3-gguf, transformers 5.12; mount_tests/modern/setup_chroot.sh).

Each case is a Hugging Face directory written by transformers' save_pretrained in the chroot
(gen_gguf/make_hf_dir.py) with GPT-2's published tokenizer (gen_gguf/tokenizers/gpt2, from npm), mounted with
ckptfs, which names the tokenizer's pre-tokenizer as the converter does (gpt-2). The reference: Debian's
convert_hf_to_gguf.py --outtype T run on a directory named `hf` holding the mount's model.safetensors,
config.json, generation_config.json and tokenizer files. Every gguf/ file must have the converter's name and
bytes; gguf-dump reads it; llama-completion (--temp 0, fixed seed) writes the same text from a mounted file
as from the converter's; -o gguf_pre=NAME (the name forced) gives the same files. Qwen's and Meta's Llama 3
published tokenizers (gen_gguf/tokenizers/qwen3 and llama3, from npm) are named qwen2 and smaug-bpe as the converter
names them, Meta's later Llama 3 revision (its TemplateProcessing adds the BOS) llama-bpe. A tokenizer whose check-text ids the converter does not know is refused by both: no gguf/, and inspect
says why; so are GPT-2's tokenizer on a Qwen2 model (transformers' Qwen2Tokenizer replaces its pre-tokenizer) and
a GPT-2 config.json without n_ctx.

Qwen3 (q/k norms, a head_dim other than hidden/heads), Qwen3-MoE and Mixtral (experts stacked into 3-D tensors)
are cases too, Mixtral mounted with -o shard_size so that hf/ is several safetensors files (the converter takes them
file by file). -o gguf_name=NAME gives the converter's files for a directory of that name (general.name, basename,
version, file names). Megatron-LM's own MoE saves (fixtures/megatron-core-gen) beside a real tokenizer get no gguf/
as the converter gets none from their hf/: their 60-token vocabulary is smaller than any real tokenizer's.

ATEN_CPU_CAPABILITY=default for the converter: torch's float32 pow behind the llama3 rope_freqs tensor
depends on the CPU's vector unit otherwise (docs/formats/gguf.md).
"""
import filecmp
import json
import os
import shutil
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "modern"))
import helpers as H  # noqa: E402
from mounting import mounted  # noqa: E402
from test_megatron_hf import chroot_dir  # noqa: E402,F401 (a fixture: the sid chroot)
from test_modern_clients import in_chroot, staged  # noqa: E402,F401 (staged: a fixture)

GEN = os.path.join(HERE, "gen_gguf")
CONVERTER = "/usr/share/doc/llama.cpp-tools/scripts/convert_hf_to_gguf.py"
OUTTYPES = ["f32", "f16", "bf16", "q8_0"]
REFERENCE_FILES = ["model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                   "tokenizer_config.json"]

CASES = {
    # 11 layers (names in text order: layers.10 before layers.2), GQA 4/2, untied, bf16; intermediate 80: the
    # ffn_down rows are not a multiple of 32, so q8_0 keeps them F16
    "llama-bf16-gqa-untied": {"arch": "llama", "dtype": "bfloat16", "layers": 11, "hidden": 64,
                              "intermediate": 80, "heads": 4, "kv_heads": 2, "tied": False, "seed": 1,
                              "run": "Q8_0"},
    # tied embeddings, f16, llama3 rope scaling: rope_freqs computed at mount
    "llama-f16-tied-llama3-rope": {"arch": "llama", "dtype": "float16", "layers": 2, "hidden": 128,
                                   "intermediate": 96, "heads": 4, "kv_heads": 4, "tied": True, "seed": 2,
                                   "run": "BF16",
                                   "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 64}},
    # Qwen2 with Qwen's published tokenizer (151,936 ids, chat template, NFC normalizer): q/k/v biases (F32),
    # tied, GQA, no Q/K permutation. transformers loads Qwen2Tokenizer for it (its own NFC and Split around the
    # file's vocabulary), whose check-text ids ckptfs encodes as well: qwen2 found
    "qwen2-bf16-tied-biases": {"arch": "qwen2", "dtype": "bfloat16", "layers": 3, "hidden": 64,
                               "intermediate": 128, "heads": 4, "kv_heads": 2, "tied": True, "seed": 3,
                               "run": "F16", "tokenizer_files": "qwen3", "vocab_size": 151936,
                               "eos_token_id": 151643, "expect_pre": "qwen2"},
    # Llama with Meta's published Llama 3 tokenizer (128,256 ids, ignore_merges, Split with \p{N}{1,3}, the first
    # revision's ByteLevel post-processor): smaug-bpe found; one layer, tied (seed 11: llama-completion's 12 tokens
    # are whole UTF-8 characters, which the text comparison needs)
    "llama3-tokenizer": {"arch": "llama", "dtype": "bfloat16", "layers": 1, "hidden": 64, "intermediate": 64,
                         "heads": 4, "kv_heads": 2, "tied": True, "seed": 11, "run": "Q8_0",
                         "tokenizer_files": "llama3", "vocab_size": 128256, "eos_token_id": 128001,
                         "expect_pre": "smaug-bpe"},
    # the same with Meta's later revision of that tokenizer (a Sequence of the ByteLevel post-processor and a
    # TemplateProcessing that puts <|begin_of_text|> first): llama-bpe found, add_bos_token true
    "llama3-later-tokenizer": {"arch": "llama", "dtype": "bfloat16", "layers": 1, "hidden": 64, "intermediate": 64,
                               "heads": 4, "kv_heads": 2, "tied": True, "seed": 11, "run": "BF16",
                               "tokenizer_files": "llama3", "tokenizer_edit": "llama3_bos", "vocab_size": 128256,
                               "eos_token_id": 128001, "expect_pre": "llama-bpe",
                               "expect_keys": ["tokenizer.ggml.add_bos_token = True"]},
    # Qwen3 with Qwen's tokenizer: q_norm/k_norm (F32), head_dim 32 though hidden/heads is 16, GQA, tied
    "qwen3-bf16-head-dim": {"arch": "qwen3", "dtype": "bfloat16", "layers": 2, "hidden": 64, "intermediate": 96,
                            "heads": 4, "kv_heads": 2, "tied": True, "seed": 6, "run": "BF16",
                            "config": {"head_dim": 32}, "tokenizer_files": "qwen3", "vocab_size": 151936,
                            "eos_token_id": 151643, "expect_pre": "qwen2"},
    # Qwen3-MoE: 4 experts (top 2) stacked into ffn_{down,gate,up}_exps, the router ffn_gate_inp (F32), expert
    # keys, a head_dim in config.json, size label 4x...; untied
    "qwen3moe-bf16": {"arch": "qwen3_moe", "dtype": "bfloat16", "layers": 2, "hidden": 64, "intermediate": 96,
                      "heads": 4, "kv_heads": 2, "tied": False, "seed": 7, "run": "Q8_0",
                      "config": {"num_local_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                 "head_dim": 32},
                      "tokenizer_files": "qwen3", "vocab_size": 151936, "eos_token_id": 151643,
                      "expect_pre": "qwen2"},
    # Mixtral (Llama's converter class: Q/K permuted, experts w1/w2/w3 stacked; w2's 80-element rows keep F16 in
    # q8_0), served in 200 KB shards: the embeddings and lm_head alone, a layer's experts across files
    "mixtral-bf16-sharded": {"arch": "mixtral", "dtype": "bfloat16", "layers": 2, "hidden": 64, "intermediate": 80,
                             "heads": 4, "kv_heads": 2, "tied": False, "seed": 8, "run": "F16",
                             "config": {"num_local_experts": 4, "num_experts_per_tok": 2},
                             "mount": ["-o", "shard_size=200KB"]},
    # GPT-2: Conv1D weights transposed (read through the transposed tiles), biases, layer norms with biases,
    # position embeddings kept F32, tied; n_ctx added to config.json as OpenAI's has it (the converter needs it)
    "gpt2-f32-tied": {"arch": "gpt2", "dtype": "float32", "layers": 2, "hidden": 64, "heads": 4, "seed": 5,
                      "run": "Q8_0"},
}


def require_converter(chroot):
    root, versions = chroot
    if versions is None or "llama.cpp-tools" not in versions:
        pytest.fail(f"the Debian unstable chroot with llama.cpp-tools is not set up ({root}): run "
                    f"`CKPTFS_CHROOT={root} CKPTFS_CHROOT_SUITE=sid bash mount_tests/modern/setup_chroot.sh` "
                    f"(or set CKPTFS_SKIP_MODERN=1 to skip these tests)", pytrace=False)
    return root


def chroot_run(root, *args, timeout=600):
    proc = in_chroot(root, "env", "ATEN_CPU_CAPABILITY=default", *args, timeout=timeout)
    assert proc.returncode == 0, H.describe(proc)
    return proc


def make_case(root, host, inside, spec):
    """Writes the HF directory of `spec` (a CASES value) in the chroot: (host path, chroot path)."""
    shutil.copytree(GEN, os.path.join(host, "gen_gguf"))
    case = dict(spec, tokenizer=f"{inside}/gen_gguf/tokenizers/gpt2")
    if "tokenizer_files" in case:
        case["tokenizer_files"] = f"{inside}/gen_gguf/tokenizers/{case['tokenizer_files']}"
    with open(os.path.join(host, "case.json"), "w") as f:
        json.dump(case, f)
    chroot_run(root, "python3", f"{inside}/gen_gguf/make_hf_dir.py", f"{inside}/case.json", f"{inside}/src")
    return os.path.join(host, "src"), f"{inside}/src"


@pytest.fixture(scope="module")
def made_cases(chroot_dir):
    """case name -> (host path, chroot path) of its HF directory, written once for the module's tests."""
    root, _ = chroot_dir
    tag = f"ckptfs-gguf-cases-{os.getpid()}"
    host = os.path.join(root, "tmp", tag)
    shutil.rmtree(host, ignore_errors=True)
    made = {}

    def get(name):
        if name not in made:
            made[name] = make_case(require_converter(chroot_dir), os.path.join(host, name), f"/tmp/{tag}/{name}",
                                   CASES[name])
        return made[name]

    yield get
    shutil.rmtree(host, ignore_errors=True)


def model_files(mnt):
    """The mount's files the converter reads: REFERENCE_FILES, with the shards and their index in place of
    model.safetensors where the mount serves the model in shards."""
    names = os.listdir(mnt)
    if "model.safetensors.index.json" not in names:
        return REFERENCE_FILES
    shards = sorted(n for n in names if n.startswith("model-") and n.endswith(".safetensors"))
    assert len(shards) > 1, names
    return [f for f in REFERENCE_FILES if f != "model.safetensors"] + shards + ["model.safetensors.index.json"]


def converter_files(root, host, inside, mnt, files=REFERENCE_FILES, directory="hf"):
    """The converter's outputs for a directory named `directory` holding the mount's `files`: {name: host path}."""
    ref = os.path.join(host, "ref", directory)
    os.makedirs(ref)
    for f in files:
        shutil.copy(os.path.join(mnt, f), ref)
    out = os.path.join(host, "out")
    os.makedirs(out)
    for t in OUTTYPES:
        chroot_run(root, "python3", CONVERTER, f"{inside}/ref/{directory}", "--outtype", t, "--outfile",
                   f"{inside}/out/")
    return {n: os.path.join(out, n) for n in sorted(os.listdir(out))}


def completion(root, model):
    proc = chroot_run(root, "llama-completion", "-m", model, "-p", "Hello world, the", "-n", "12", "--temp", "0",
                      "-s", "1", "-t", "2", "-no-cnv", "--no-warmup", "--no-display-prompt")
    return proc.stdout


@pytest.mark.parametrize("name", sorted(CASES))
def test_gguf_files_are_the_converters(chroot_dir, staged, made_cases, ckptfs_bin, name):
    root = require_converter(chroot_dir)
    host, inside, mnt, mnt_inside = staged(f"gguf-{name}")
    src, _ = made_cases(name)
    mount = CASES[name].get("mount", [])
    with mounted(ckptfs_bin, src, mnt, *mount):
        reference = converter_files(root, host, inside, mnt, model_files(mnt))
        ours = sorted(os.listdir(os.path.join(mnt, "gguf")))
        assert ours == sorted(reference), f"gguf/ holds {ours}; the converter wrote {sorted(reference)}"
        assert len(ours) == len(OUTTYPES)
        for n in ours:
            assert filecmp.cmp(os.path.join(mnt, "gguf", n), reference[n], shallow=False), f"{n} differs"
        f16 = next(n for n in ours if n.endswith("-F16.gguf"))
        dump = chroot_run(root, "gguf-dump", "--no-tensors", f"{mnt_inside}/gguf/{f16}")
        expected_pre = CASES[name].get("expect_pre", "gpt-2")
        for key in [f"tokenizer.ggml.pre = '{expected_pre}'"] + CASES[name].get("expect_keys", []):
            assert key in dump.stdout, H.describe(dump)
        # llama.cpp runs on the mount (one output type per case: the bytes are the converter's already)
        run = next(n for n in ours if n.endswith(f"-{CASES[name]['run']}.gguf"))
        theirs = completion(root, f"{inside}/out/{run}")
        assert theirs.strip(), f"llama-completion wrote nothing for {run}"
        assert completion(root, f"{mnt_inside}/gguf/{run}") == theirs, run
    # the name found, then forced: the same files
    with mounted(ckptfs_bin, src, mnt, *mount, "-o", f"gguf_pre={expected_pre}"):
        for n in ours:
            assert filecmp.cmp(os.path.join(mnt, "gguf", n), reference[n], shallow=False), f"{n} differs"


def drop_first_merge(src):
    edit_json(os.path.join(src, "tokenizer.json"), lambda t: t["model"]["merges"].pop(0))


def drop_n_ctx(src):
    edit_json(os.path.join(src, "config.json"), lambda c: c.pop("n_ctx"))


def edit_json(path, edit):
    with open(path) as f:
        value = json.load(f)
    edit(value)
    with open(path, "w") as f:
        json.dump(value, f)


NOT_RECOGNIZED = "BPE pre-tokenizer was not recognized"
# name: (case, edit of its directory, the converter's error, inspect's reason)
REFUSED = {
    # GPT-2's tokenizer without its first merge: the check text's ids hash to nothing the converter knows
    "merge-dropped": (CASES["llama-bf16-gqa-untied"], drop_first_merge, NOT_RECOGNIZED, "would not recognise"),
    # GPT-2's tokenizer on a Qwen2 model: transformers loads Qwen2Tokenizer, which replaces its pre-tokenizer
    "qwen2-with-gpt2-tokenizer": ({"arch": "qwen2", "dtype": "bfloat16", "layers": 1, "hidden": 64,
                                   "intermediate": 128, "heads": 4, "kv_heads": 2, "tied": True, "seed": 4},
                                  None, NOT_RECOGNIZED, "Qwen2Tokenizer"),
    # GPT-2 as transformers 5 saves it: no n_ctx in config.json
    "gpt2-without-n_ctx": (CASES["gpt2-f32-tied"], drop_n_ctx, "KeyError: 'n_ctx'", "n_ctx missing"),
    # Qwen3-MoE with a dense layer (mlp_only_layers): qwen3moe has no ffn_gate/ffn_up/ffn_down tensors
    "qwen3moe-dense-layer": ({"arch": "qwen3_moe", "dtype": "bfloat16", "layers": 2, "hidden": 64,
                              "intermediate": 96, "heads": 4, "kv_heads": 2, "tied": True, "seed": 9,
                              "config": {"num_local_experts": 4, "num_experts_per_tok": 2,
                                         "moe_intermediate_size": 32, "mlp_only_layers": [1]}},
                             None, "Can not map tensor 'model.layers.1.mlp.down_proj.weight'",
                             "cannot map tensor model.layers.1.mlp.down_proj.weight"),
}


@pytest.mark.parametrize("refused", sorted(REFUSED))
def test_what_the_converter_refuses_has_no_gguf_file(chroot_dir, staged, ckptfs_bin, refused):
    """The converter fails on the directory; the mount has no gguf/ and inspect says why."""
    root = require_converter(chroot_dir)
    spec, edit, error, why = REFUSED[refused]
    host, inside, mnt, _ = staged(f"gguf-{refused}")
    src, _ = make_case(root, host, inside, spec)
    if edit:
        edit(src)
    os.rename(src, os.path.join(host, "hf"))
    src = os.path.join(host, "hf")
    proc = in_chroot(root, "env", "ATEN_CPU_CAPABILITY=default", "python3", CONVERTER, f"{inside}/hf", "--outtype",
                     "f16", "--outfile", f"{inside}/refused.gguf")
    assert proc.returncode != 0 and error in proc.stdout + proc.stderr, H.describe(proc)
    with mounted(ckptfs_bin, src, mnt):
        assert not os.path.exists(os.path.join(mnt, "gguf")), "gguf/ for a pre-tokenizer the converter refuses"
        with open(os.path.join(mnt, "ckptfs.json")) as f:
            assert why in json.load(f)["tags"][0]["gguf_refused"]
    inspect = H.run([ckptfs_bin, "inspect", src])
    assert "note: no gguf/" in inspect.stdout and why in inspect.stdout, H.describe(inspect)
    described = json.loads(H.run([ckptfs_bin, "inspect", "--json", src]).stdout)
    assert why in described["tags"][0]["gguf_refused"], described["tags"][0]


def write_hf_dir(path, tokenizer_config):
    """A Llama-named one-tensor HF dir (safetensors written by hand) with the side files the gguf/ view reads."""
    os.makedirs(path)
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "F32", "shape": [4, 2], "data_offsets": [0, 32]}})
    header += " " * (-len(header) % 8)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header.encode() + bytes(range(32)))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4, "hidden_size": 2,
              "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 2,
              "max_position_embeddings": 8, "rms_norm_eps": 1e-6}
    for name, value in (("config.json", config), ("tokenizer.json", {"model": {"type": "BPE", "vocab": [1]}}),
                        ("tokenizer_config.json", tokenizer_config)):
        with open(os.path.join(path, name), "w") as f:
            json.dump(value, f)


@pytest.mark.parametrize("tokenizer_config, why", [
    ([], "tokenizer_config.json is not a JSON object"),
    ({"tokenizer_class": "PreTrainedTokenizerFast"}, "tokenizer.json"),
], ids=["not an object", "fields of other types"])
def test_malformed_side_files_cost_only_gguf(ckptfs_bin, tmp_path, tokenizer_config, why):
    """JSON side files the converter would choke on leave the model's views served (no gguf/, inspect says why),
    never an internal error."""
    src = str(tmp_path / "hf")
    write_hf_dir(src, tokenizer_config)
    with mounted(ckptfs_bin, src, str(tmp_path / "mnt")) as m:
        model = H.read_safetensors(os.path.join(m, "model.safetensors"))
        assert model["model.embed_tokens.weight"].numpy().tobytes() == bytes(range(32))
        assert not os.path.exists(os.path.join(m, "gguf"))
    inspect = H.run([ckptfs_bin, "inspect", src])
    H.assert_ok(inspect)
    assert "note: no gguf/" in inspect.stdout and why in inspect.stdout, inspect.stdout


EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "fsdp-llama-gguf")


def test_bundled_example_is_the_converters(chroot_dir, staged, ckptfs_bin):
    """examples/fsdp-llama-gguf: real FSDP1 rank files of a Llama (torch 2.14) beside its config.json and GPT-2's
    real tokenizer, as saved by transformers: every gguf/ file is the converter's and llama.cpp runs on it as on
    the converter's file (what examples/run.sh shows where llama.cpp is installed)."""
    root = require_converter(chroot_dir)
    host, inside, mnt, mnt_inside = staged("gguf-example")
    with mounted(ckptfs_bin, EXAMPLE, mnt):
        reference = converter_files(root, host, inside, mnt,
                                    ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"])
        ours = sorted(os.listdir(os.path.join(mnt, "gguf")))
        assert ours == sorted(reference) and "Hf-805K-BF16.gguf" in ours, ours
        for n in ours:
            assert filecmp.cmp(os.path.join(mnt, "gguf", n), reference[n], shallow=False), f"{n} differs"
        theirs = completion(root, f"{inside}/out/Hf-805K-BF16.gguf")
        assert theirs.strip() and completion(root, f"{mnt_inside}/gguf/Hf-805K-BF16.gguf") == theirs


# A name giving a version, a basename and a size that is not the model's (a context length: finetune "8b")
GGUF_NAME = "Llama-3-8B-Instruct-v0.2"


def test_gguf_name_gives_the_converters_files_for_that_directory(chroot_dir, staged, made_cases, ckptfs_bin):
    """-o gguf_name=NAME: every file is the converter's for the same files in a directory named NAME (Mixtral in
    shards: the size label is the experts' 4x...)."""
    root = require_converter(chroot_dir)
    host, inside, mnt, mnt_inside = staged("gguf-name")
    src, _ = made_cases("mixtral-bf16-sharded")
    with mounted(ckptfs_bin, src, mnt, *CASES["mixtral-bf16-sharded"]["mount"], "-o", f"gguf_name={GGUF_NAME}"):
        reference = converter_files(root, host, inside, mnt, model_files(mnt), directory=GGUF_NAME)
        ours = sorted(os.listdir(os.path.join(mnt, "gguf")))
        assert ours == sorted(reference), f"gguf/ holds {ours}; the converter wrote {sorted(reference)}"
        assert all(n.startswith("Llama-3-4x") and "-8b-Instruct-v0.2-" in n for n in ours), ours
        for n in ours:
            assert filecmp.cmp(os.path.join(mnt, "gguf", n), reference[n], shallow=False), f"{n} differs"
        dump = chroot_run(root, "gguf-dump", "--no-tensors", f"{mnt_inside}/gguf/{ours[0]}")
        for key in ("general.name = 'Llama 3 8B Instruct v0.2'", "general.version = 'v0.2'",
                    "general.basename = 'Llama-3'", "general.finetune = '8b-Instruct'"):
            assert key in dump.stdout, H.describe(dump)
    bad = H.run([ckptfs_bin, src, mnt, "-o", "gguf_name=../x"])
    assert bad.returncode != 0 and "gguf_name" in bad.stderr, H.describe(bad)


MEGATRON_FIXTURES = os.path.join(HERE, "fixtures", "megatron-core-gen")


@pytest.mark.parametrize("fixture, case", [("qwen3moe_torch_dist_ep2_distopt", "qwen3moe-bf16"),
                                           ("mixtral_legacy_ep2", "mixtral-bf16-sharded")])
def test_megatron_moe_save_beside_a_tokenizer(chroot_dir, staged, made_cases, ckptfs_bin, fixture, case):
    """Megatron-LM's own MoE save with a real tokenizer beside it (the case's: Qwen's for Qwen3-MoE, GPT-2's for
    Mixtral), as users keep them: hf/ serves the experts one by one with the tokenizer files. The converter run on
    that hf/ stacks the experts, then fails on the vocabulary (the save's 60 tokens hold no real tokenizer); the
    mount (with the case's -o gguf_pre, if any) has no gguf/ and says why in those terms in ckptfs.json (the
    tensors passed: ckptfs maps them first, too)."""
    root = require_converter(chroot_dir)
    host, inside, mnt, _ = staged(f"gguf-{fixture}")
    src = os.path.join(host, "save")
    shutil.copytree(os.path.join(MEGATRON_FIXTURES, fixture, "checkpoint"), src)
    case_src, _ = made_cases(case)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(case_src, f), src)
    options = ["-o", f"gguf_pre={CASES[case]['pre']}"] if "pre" in CASES[case] else []
    with mounted(ckptfs_bin, src, mnt, *options):
        hf = os.path.join(mnt, "hf")
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(hf))
        experts = [n for n in H.read_safetensors(os.path.join(hf, "model.safetensors")) if ".experts.0." in n]
        assert experts, "hf/ has no per-expert tensors"
        assert not os.path.exists(os.path.join(mnt, "gguf"))
        with open(os.path.join(mnt, "ckptfs.json")) as f:
            why = json.load(f)["tags"][0]["gguf_refused"]
        assert "outside config.json's vocab_size" in why, why
        ref = os.path.join(host, "hf")
        os.makedirs(ref)
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(hf, f), ref)
    proc = in_chroot(root, "env", "ATEN_CPU_CAPABILITY=default", "python3", CONVERTER, f"{inside}/hf", "--outtype",
                     "f16", "--outfile", f"{inside}/refused.gguf")
    assert proc.returncode != 0, H.describe(proc)
    assert "assert max(tokenizer.vocab.values()) < vocab_size" in proc.stderr, H.describe(proc)
