#!/usr/bin/python3
"""The writer of mount_tests/test_live_run.py: a training run's saves, one tag at a time, driven over stdin.

    /usr/bin/python3 mount_tests/live_writer.py deepspeed SAVE_DIR REF_DIR      (torch 1.13, the host)
    python3 live_writer.py dcp SAVE_DIR REF_DIR                                  (torch 2.x, the Debian chroot)

Each line on stdin is a command; each command answers one line on stdout (``ok ...`` or ``error ...``):

deepspeed (the tags of the generator's ZeRO-2 bf16 DP 2 case, mount_tests/gen/generate.py, with the values of
each tag seeded by its name, so every tag holds other bytes):
  ``write TAG``        writes REF_DIR/TAG/{model.pt,fp32.pt} (the generator's expected views of the tag,
                       computed from its own values), then SAVE_DIR/TAG/ with every rank file, with real
                       ``torch.save``, as DeepSpeed does: model states first, then the optimizer ranks; answers
                       ``ok files TAG``. ``latest`` is not touched.
  ``write TAG pause``  the same, but stops after the first file and half of the second (flushed and fsynced:
                       a save in progress), answers ``ok paused TAG`` and waits for the next line
                       (``resume``), then finishes and answers ``ok files TAG``.
  ``latest TAG``       writes SAVE_DIR/latest as DeepSpeed's ``save_checkpoint`` does, after the tag's files:
                       ``open(latest, 'w').write(tag)`` (truncated, then written: not atomic); ``ok latest TAG``.
dcp (a real ``torch.distributed.checkpoint.save`` without a process group, one rank):
  ``save STEP``        writes REF_DIR/step-STEP/{model.pt,model.safetensors} (the saved ``model`` subtree, by
                       ``torch.save`` and by the safetensors library's ``save_file(..., metadata={"format":
                       "pt"})``: what ckptfs's model.safetensors must be, byte for byte, docs/formats/dcp.md),
                       then ``dcp.save`` of {model, optimizer, step} into SAVE_DIR/step-STEP/; ``ok saved``.
  ``save STEP pause``  the same, but waits inside the save after the data files are written and before
                       ``.metadata`` is (FileSystemWriter.finish, which writes it last): ``ok paused
                       step-STEP``, then the next line (``resume``) lets it finish.
both: ``quit``.
"""
import os
import sys


ANSWERS = sys.stdout  # main() makes it a copy of fd 1 and sends fd 1 itself to stderr


def say(line):
    ANSWERS.write(line + "\n")
    ANSWERS.flush()


def wait_for(word):
    line = sys.stdin.readline()
    if line.strip() != word:
        raise SystemExit(f"live_writer: expected {word!r}, got {line!r}")


def fsync_write(path, data, mode="wb"):
    with open(path, mode) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------------------------------
# DeepSpeed

CASE = "z2_bf16_dp2"


class DeepSpeedWriter:
    def __init__(self, save_dir, ref_dir):
        import io
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, "gen"))
        import torch
        import generate as G
        self.io, self.torch, self.G = io, torch, G
        self.save_dir, self.ref_dir = save_dir, ref_dir
        torch.set_num_threads(1)
        case = dict(next(c for c in G.make_cases() if c["name"] == CASE))
        case["ds_config"] = G.ds_config(case["stage"], case["dtype"], False, False)
        self.case = case

    def write(self, tag, pause=False):
        G, torch = self.G, self.torch
        case = dict(self.case, global_steps=int(tag.rsplit("step", 1)[-1]))
        entries = G.entries_of(case)
        values = G.Values(entries, G.DTYPES[case["dtype"]], case["stage"], G.case_seed("live-run", tag))
        files = []  # (path, bytes) in the order the generator saves them (DeepSpeed's order)
        real_save = G.save

        def collect(obj, path):
            buf = self.io.BytesIO()
            torch.save(obj, buf)
            files.append((path, buf.getvalue()))

        tagdir = os.path.join(self.save_dir, tag)
        G.save = collect
        try:
            module = G.write_zero012(case, tagdir, entries, values)
        finally:
            G.save = real_save
        fp32, model = G.expected_outputs(case, entries, values, module)
        ref = os.path.join(self.ref_dir, tag)
        os.makedirs(ref, exist_ok=True)
        torch.save(fp32, os.path.join(ref, "fp32.pt"))
        torch.save(model, os.path.join(ref, "model.pt"))
        os.makedirs(tagdir)
        for i, (path, data) in enumerate(files):
            if pause and i == 1:
                half = len(data) // 2
                fsync_write(path, data[:half])
                say(f"ok paused {tag}")
                wait_for("resume")
                fsync_write(path, data[half:], "ab")
            else:
                fsync_write(path, data)
        say(f"ok files {tag}")

    def latest(self, tag):
        with open(os.path.join(self.save_dir, "latest"), "w") as fd:  # deepspeed/runtime/engine.py
            fd.write(tag)
        say(f"ok latest {tag}")

    def command(self, words):
        if words[0] == "write" and len(words) in (2, 3):
            self.write(words[1], pause=words[2:] == ["pause"])
        elif words[0] == "latest" and len(words) == 2:
            self.latest(words[1])
        else:
            say(f"error unknown command {' '.join(words)}")


# ---------------------------------------------------------------------------------------------------
# PyTorch DCP

class DcpWriter:
    def __init__(self, save_dir, ref_dir):
        import torch
        import torch.distributed.checkpoint as dcp
        from safetensors.torch import save_file
        self.torch, self.dcp, self.save_file = torch, dcp, save_file
        self.save_dir, self.ref_dir = save_dir, ref_dir
        torch.set_num_threads(1)
        self.pause = False
        real_finish = dcp.FileSystemWriter.finish

        def finish(writer, *args, **kwargs):  # writes .metadata: the last file of a save
            if self.pause:
                say(f"ok paused {self.step_name}")
                wait_for("resume")
            return real_finish(writer, *args, **kwargs)

        dcp.FileSystemWriter.finish = finish

    def state(self, step):
        torch = self.torch
        g = torch.Generator().manual_seed(1000 + step)
        model = {
            "tok_embeddings.weight": torch.randn(97, 24, generator=g),
            "layers.0.attention.wq.weight": torch.randn(24, 24, generator=g).to(torch.bfloat16),
            "layers.0.attention.wq.bias": torch.randn(24, generator=g).to(torch.float16),
            "layers.0.feed_forward.w1.weight": torch.randn(40, 24, generator=g),
            "norm.weight": torch.randn(24, generator=g).to(torch.bfloat16),
            "step_count": torch.tensor([step, 2 ** 40 + step], dtype=torch.int64),
        }
        optimizer = {"state": {"tok_embeddings.weight": {"exp_avg": torch.randn(97, 24, generator=g),
                                                         "step": torch.tensor(float(step))}},
                     "param_groups": [{"lr": 0.01, "params": ["tok_embeddings.weight"]}]}
        return {"model": model, "optimizer": optimizer, "step": step}

    def save(self, step, pause=False):
        self.step_name = f"step-{step}"
        state = self.state(step)
        ref = os.path.join(self.ref_dir, self.step_name)
        os.makedirs(ref, exist_ok=True)
        self.torch.save(state["model"], os.path.join(ref, "model.pt"))
        self.save_file(state["model"], os.path.join(ref, "model.safetensors"), metadata={"format": "pt"})
        path = os.path.join(self.save_dir, self.step_name)
        os.makedirs(path)
        self.pause = pause
        try:
            self.dcp.save(state, storage_writer=self.dcp.FileSystemWriter(path))
        finally:
            self.pause = False
        say(f"ok saved {self.step_name}")

    def command(self, words):
        if words[0] == "save" and len(words) in (2, 3):
            self.save(int(words[1]), pause=words[2:] == ["pause"])
        else:
            say(f"error unknown command {' '.join(words)}")


def main(argv):
    if len(argv) != 4 or argv[1] not in ("deepspeed", "dcp"):
        raise SystemExit(__doc__)
    kind, save_dir, ref_dir = argv[1:]
    # the answers alone on stdout: what libraries print there (UCX's warnings at torch's import) goes to stderr
    global ANSWERS
    sys.stdout.flush()
    ANSWERS = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    os.makedirs(save_dir, exist_ok=True)
    os.makedirs(ref_dir, exist_ok=True)
    writer = (DeepSpeedWriter if kind == "deepspeed" else DcpWriter)(save_dir, ref_dir)
    say(f"ok ready {kind}")
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words == ["quit"]:
            break
        writer.command(words)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
