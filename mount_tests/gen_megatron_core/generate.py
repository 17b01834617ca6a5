"""Writes mount_tests/fixtures/megatron-core-gen with Megatron-LM's own code (see README.md beside this file).

    /usr/bin/python3 mount_tests/gen_megatron_core/generate.py [OUT_DIR] [--only CASE ...]
        [--chroot /var/cache/ckptfs/sid] [--megatron /opt/megatron-lm]

Per case: one gloo process per rank of `mcore_run.py save` in the chroot (each in a private mount namespace
with /proc mounted: Megatron's checkpoint writer asks psutil about itself), then `mcore_run.py expect` at world
size 1 loading what they saved; checkpoint/ and expected/ are copied to OUT_DIR/<case>/.  Run by hand, as root.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cases import CASES  # noqa: E402

MEGATRON_COMMIT = "2a75ac12c5"
STEPS = 2
STAGE = "tmp/gen-megatron-core"  # inside the chroot


def launch(chroot, megatron, rank, world, port, argv, env=()):
    inner = ["env", "-i", "PATH=/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8", "OMP_NUM_THREADS=1", "USE_LIBUV=0",
             "MASTER_ADDR=127.0.0.1", f"MASTER_PORT={port}", f"RANK={rank}", f"LOCAL_RANK={rank}",
             f"WORLD_SIZE={world}", "CUDA_DEVICE_MAX_CONNECTIONS=1", f"PYTHONPATH={megatron}",
             "PYTHONDONTWRITEBYTECODE=1", f"GEN_STEPS={STEPS}", *env,
             "python3", "-W", "ignore", f"/{STAGE}/mcore_run.py", *argv]
    script = 'mount -t proc proc "$1/proc" && shift && exec chroot "$@"'
    return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                             chroot, chroot, *inner], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_ranks(chroot, megatron, world, port, argv, env, log):
    procs = [launch(chroot, megatron, r, world, port, argv, env) for r in range(world)]
    outs = [p.communicate()[0] for p in procs]
    with open(log, "w") as f:
        f.write("\n".join(f"===== rank {r}\n{o}" for r, o in enumerate(outs)))
    bad = [r for r, p in enumerate(procs) if p.returncode]
    if bad:
        tail = "\n".join(outs[bad[0]].splitlines()[-30:])
        raise SystemExit(f"{argv[0]} failed on ranks {bad} (log {log}):\n{tail}")


def generate(name, c, chroot, megatron, out_dir, port):
    stage = os.path.join(chroot, STAGE, name)
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    inside = f"/{STAGE}/{name}"
    legacy = c["format"] == "torch"
    env = [f"GEN_REFERENCE_SAVE={inside}/reference"] if legacy and not c["refused"] else []
    print(f"{name}: saving at world size {c['world']} ...", flush=True)
    run_ranks(chroot, megatron, c["world"], port, ["save", f"{inside}/save.json", "--", *c["args"],
                                                   "--save", f"{inside}/save"], env, os.path.join(stage, "save.log"))
    dest = os.path.join(out_dir, name)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(os.path.join(stage, "save"), os.path.join(dest, "checkpoint"))
    if not c["refused"]:
        print(f"{name}: Megatron's load at world size 1 ...", flush=True)
        load = f"{inside}/reference" if legacy else f"{inside}/save"
        one = [a for a in c["args"] if a != "--use-distributed-optimizer"]
        for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                     "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--global-batch-size"):
            if flag in one:
                one[one.index(flag) + 1] = "1"
        one[one.index("--ckpt-format") + 1] = "torch_dist"
        run_ranks(chroot, megatron, 1, port, ["expect", f"{inside}/expected", "--", *one, "--load", load,
                                              "--no-load-rng", "--no-load-optim"],
                  [f"GEN_MASTERS={int(c['masters'])}"], os.path.join(stage, "expect.log"))
        shutil.copytree(os.path.join(stage, "expected"), os.path.join(dest, "expected"))
    info = {k: v for k, v in c.items() if k != "model"}
    info.update(megatron_commit=MEGATRON_COMMIT, steps=STEPS, mount_src="checkpoint",
                tag=f"iter_{STEPS:07d}")
    with open(os.path.join(dest, "case.json"), "w") as f:
        json.dump(info, f, indent=1)
    shutil.rmtree(stage)


README_HEAD = """# Megatron checkpoints written by Megatron-LM's own code (generated; do not edit)

Written by `mount_tests/gen_megatron_core/generate.py` (see its README.md): Megatron-LM {commit} (0.20.0,
Megatron-Bridge's pin) on CPU in the Debian unstable chroot (torch 2.14, gloo, one process per rank): its
GPTModel (local layer spec), ChainedOptimizer, {steps} Adam steps and `save_checkpoint`; the expectations from its
own `load_checkpoint` of the save at world size 1 (TP=1 PP=1 EP=1).

Each case: `checkpoint/` (exactly as Megatron wrote it), `case.json` (the parallelism, the family, the full
command line), and unless refused `expected/`: `full_model.pt` + `manifest.json` (the model Megatron loads at
TP=1 PP=1 EP=1: megatron-core local-spec names, global layer and expert numbers, padded vocabulary, bf16),
`fp32.pt` (the fp32 masters Megatron's dist_checkpointing reads back, when the optimizer is not distributed),
`logits.json` (GPTModel's fp32 forward on fixed tokens, the true vocabulary's logits, `atol`).
Every case's command: `mcore_run.py save OUT -- ARGS --save DIR` with ARGS = `case.json`'s `args`.

| case | family | format | parallelism (world) | Megatron wrote |
|---|---|---|---|---|
"""


def write_readme(out_dir):
    rows = []
    for name in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, name, "case.json")
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            c = json.load(f)
        ck = os.path.join(out_dir, name, "checkpoint")
        files = sorted(os.path.relpath(os.path.join(d, f), ck) for d, _, fs in os.walk(ck) for f in fs)
        extra = [a for a in c["args"] if a in ("--use-distributed-optimizer", "--no-save-optim")]
        par = f"TP{c['tp']} PP{c['pp']} EP{c['ep']} ETP{c['etp']} DP{c['dp']} ({c['world']})"
        note = f"; refused: {c['refused']}" if c["refused"] else ""
        rows.append(f"| `{name}` | {c['family']} | {c['format']} {' '.join(extra)} | {par} | "
                    f"{len(files)} files: {', '.join(f'`{f}`' for f in files)}{note} |")
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(README_HEAD.format(commit=MEGATRON_COMMIT, steps=STEPS) + "\n".join(rows) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", nargs="?", default=os.path.join(HERE, "..", "fixtures", "megatron-core-gen"))
    ap.add_argument("--only", nargs="+", choices=sorted(CASES))
    ap.add_argument("--chroot", default=os.environ.get("CKPTFS_SID_CHROOT", "/var/cache/ckptfs/sid"))
    ap.add_argument("--megatron", default="/opt/megatron-lm", help="Megatron-LM checkout, inside the chroot")
    a = ap.parse_args()
    commit_file = os.path.join(a.chroot, a.megatron.lstrip("/"), ".commit")
    with open(commit_file) as f:
        assert f.read().strip() == MEGATRON_COMMIT, f"{commit_file}: not Megatron-LM {MEGATRON_COMMIT}"
    os.makedirs(os.path.join(a.chroot, STAGE), exist_ok=True)
    for f in ("mcore_run.py", "cpu_glue.py"):
        shutil.copy(os.path.join(HERE, f), os.path.join(a.chroot, STAGE, f))
    for i, name in enumerate(a.only or CASES):
        generate(name, CASES[name], a.chroot, a.megatron, a.out_dir, 29600 + i)
    write_readme(a.out_dir)


if __name__ == "__main__":
    main()
