"""The gguf/ view (issue 33, docs/formats/gguf.md) against llama.cpp's own converter, in the Debian unstable
chroot (llama.cpp-tools 0.7.0, python3-gguf, transformers 5.12; mount_tests/modern/setup_chroot.sh).

Each case is a Hugging Face directory written by transformers' save_pretrained in the chroot
(gen_gguf/make_hf_dir.py) with GPT-2's published tokenizer (gen_gguf/tokenizers/gpt2, from npm), mounted with
ckptfs, which names the tokenizer's pre-tokenizer as the converter does (gpt-2). The reference: Debian's
convert_hf_to_gguf.py --outtype T run on a directory named `hf` holding the mount's model.safetensors,
config.json, generation_config.json and tokenizer files. Every gguf/ file must have the converter's name and
bytes; gguf-dump reads it; llama-completion (--temp 0, fixed seed) writes the same text from a mounted file
as from the converter's; -o gguf_pre=gpt-2 (the name forced) gives the same files. A Qwen2 model with Qwen's
published tokenizer (gen_gguf/tokenizers/qwen3, from npm), whose pre-tokenizer ckptfs does not encode yet, is
mounted with -o gguf_pre=qwen2 (and without it has no gguf/). A tokenizer whose check-text ids the converter
does not know is refused by both: no gguf/, and inspect says why; so are GPT-2's tokenizer on a Qwen2 model
(transformers' Qwen2Tokenizer replaces its pre-tokenizer) and a GPT-2 config.json without n_ctx.

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
    # tied, GQA, no Q/K permutation. transformers loads Qwen2Tokenizer for it, whose pre-tokenizer ckptfs does
    # not encode yet: mounted with -o gguf_pre=qwen2, and without it no gguf/
    "qwen2-bf16-tied-biases": {"arch": "qwen2", "dtype": "bfloat16", "layers": 3, "hidden": 64,
                               "intermediate": 128, "heads": 4, "kv_heads": 2, "tied": True, "seed": 3,
                               "run": "F16", "tokenizer_files": "qwen3", "vocab_size": 151936,
                               "eos_token_id": 151643, "pre": "qwen2"},
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


def converter_files(root, host, inside, mnt, files=REFERENCE_FILES):
    """The converter's outputs for a directory named hf holding the mount's `files`: {name: host path}."""
    ref = os.path.join(host, "ref", "hf")
    os.makedirs(ref)
    for f in files:
        shutil.copy(os.path.join(mnt, f), ref)
    out = os.path.join(host, "out")
    os.makedirs(out)
    for t in OUTTYPES:
        chroot_run(root, "python3", CONVERTER, f"{inside}/ref/hf", "--outtype", t, "--outfile", f"{inside}/out/")
    return {n: os.path.join(out, n) for n in sorted(os.listdir(out))}


def completion(root, model):
    proc = chroot_run(root, "llama-completion", "-m", model, "-p", "Hello world, the", "-n", "12", "--temp", "0",
                      "-s", "1", "-t", "2", "-no-cnv", "--no-warmup", "--no-display-prompt")
    return proc.stdout


@pytest.mark.parametrize("name", sorted(CASES))
def test_gguf_files_are_the_converters(chroot_dir, staged, ckptfs_bin, name):
    root = require_converter(chroot_dir)
    host, inside, mnt, mnt_inside = staged(f"gguf-{name}")
    src, _ = make_case(root, host, inside, CASES[name])
    pre = CASES[name].get("pre")
    if pre:  # a name ckptfs does not find: no gguf/ without it
        with mounted(ckptfs_bin, src, mnt):
            assert not os.path.exists(os.path.join(mnt, "gguf"))
        inspect = H.run([ckptfs_bin, "inspect", src])
        assert "note: no gguf/" in inspect.stdout and "gguf_pre=NAME" in inspect.stdout, H.describe(inspect)
    options = ["-o", f"gguf_pre={pre}"] if pre else []
    with mounted(ckptfs_bin, src, mnt, *options):
        reference = converter_files(root, host, inside, mnt)
        ours = sorted(os.listdir(os.path.join(mnt, "gguf")))
        assert ours == sorted(reference), f"gguf/ holds {ours}; the converter wrote {sorted(reference)}"
        assert len(ours) == len(OUTTYPES)
        for n in ours:
            assert filecmp.cmp(os.path.join(mnt, "gguf", n), reference[n], shallow=False), f"{n} differs"
        f16 = next(n for n in ours if n.endswith("-F16.gguf"))
        dump = chroot_run(root, "gguf-dump", "--no-tensors", f"{mnt_inside}/gguf/{f16}")
        assert f"tokenizer.ggml.pre = '{pre or 'gpt-2'}'" in dump.stdout, H.describe(dump)
        # llama.cpp runs on the mount (one output type per case: the bytes are the converter's already)
        run = next(n for n in ours if n.endswith(f"-{CASES[name]['run']}.gguf"))
        theirs = completion(root, f"{inside}/out/{run}")
        assert theirs.strip(), f"llama-completion wrote nothing for {run}"
        assert completion(root, f"{mnt_inside}/gguf/{run}") == theirs, run
    if pre:
        return
    # the name found, then forced: the same files
    with mounted(ckptfs_bin, src, mnt, "-o", "gguf_pre=gpt-2"):
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
