"""Client of bench/loader_bench.sh, run inside the Debian 13 chroot (torch 2.x, the reference safetensors
library): loads a checkpoint file the way real loaders do and reports the time, on commands read from stdin
so that torch is imported once while the bench drops the page cache and remounts between runs.

    python3 -u loader_bench_client.py SCRATCH_DIR

Commands (one a line; each answered by one line starting with RESULT, or ERROR on failure):
    prime                         every loader on small files in SCRATCH_DIR, 1 and 4 threads (after a
                                  drop_caches: pages the loaders' code back in, outside the timed runs)
    run LOADER PATH THREADS       LOADER: safe_open (safe_open + get_tensor of every key), load_file
                                  (safetensors.torch.load_file; THREADS must be 1) or torch_load
                                  (torch.load(PATH, mmap=True, weights_only=True)); answers
                                  RESULT {"s": seconds, "bytes": tensor bytes, "tensors": n}
    quit

Both safetensors (UntypedStorage.from_file) and torch.load(mmap=True) hand back tensors that map the
file lazily: no byte is read until the tensor is used. So every tensor is also copied, in the timed region,
into a scratch buffer of its thread (reused, allocated once: like load_state_dict's copy_ into a model's
parameters), which reads every byte of the file's tensors. With THREADS > 1 the tensors (in the loader's
key order) are handed out one at a time to a pool of THREADS threads; for safe_open each thread opens its
own handle. torch runs single-threaded (set_num_threads(1)): the pool is the only parallelism.
"""
import gc
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import safetensors
import safetensors.torch
import torch
from safetensors import safe_open

torch.set_num_threads(1)


class Scratch(threading.local):
    buf = None

    def touch(self, t):
        """Copies t's bytes into this thread's scratch buffer; returns their count."""
        n = t.numel() * t.element_size()
        if n == 0:
            return 0
        if self.buf is None or self.buf.numel() < n:
            self.buf = torch.empty(n, dtype=torch.uint8)
        self.buf[:n].copy_(t.reshape(-1).view(torch.uint8))
        return n


def pooled(threads, items, work):
    """work(item) -> bytes, for every item; one at a time in this thread, else over a pool of `threads`."""
    if threads == 1:
        return [work(x) for x in items]
    with ThreadPoolExecutor(max_workers=threads) as ex:
        return list(ex.map(work, items))


def load_safe_open(path, threads, scratch):
    if threads == 1:
        with safe_open(path, framework="pt") as f:
            return [scratch.touch(f.get_tensor(k)) for k in f.keys()]
    handles = threading.local()  # one safe_open per pool thread; all closed when `handles` goes

    def work(k):
        f = getattr(handles, "f", None)
        if f is None:
            f = handles.f = safe_open(path, framework="pt")
        return scratch.touch(f.get_tensor(k))

    with safe_open(path, framework="pt") as f:
        keys = list(f.keys())
    return pooled(threads, keys, work)


def load_load_file(path, threads, scratch):
    if threads != 1:
        raise ValueError("load_file has no threads to split over")
    sd = safetensors.torch.load_file(path)
    return [scratch.touch(t) for t in sd.values()]


def load_torch_load(path, threads, scratch):
    sd = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    return pooled(threads, list(sd.values()), scratch.touch)


LOADERS = {"safe_open": load_safe_open, "load_file": load_load_file, "torch_load": load_torch_load}


def run(loader, path, threads):
    scratch = Scratch()
    t0 = time.perf_counter()
    sizes = LOADERS[loader](path, threads, scratch)
    s = time.perf_counter() - t0
    del scratch
    gc.collect()  # no map of the file left: the bench unmounts next
    return {"s": round(s, 4), "bytes": sum(sizes), "tensors": len(sizes)}


def make_prime_files(scratch_dir):
    g = torch.Generator().manual_seed(0)
    sd = {f"layer{i}.weight": torch.randn(64, 256, generator=g).to(torch.bfloat16 if i % 2 else torch.float32)
          for i in range(8)}
    st = os.path.join(scratch_dir, "prime.safetensors")
    pt = os.path.join(scratch_dir, "prime.bin")
    safetensors.torch.save_file(sd, st, metadata={"format": "pt"})
    torch.save(sd, pt)
    return st, pt


def main(argv):
    st, pt = make_prime_files(argv[1])
    print(f"READY torch {torch.__version__}, safetensors {safetensors.__version__}", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        try:
            if cmd[0] == "quit":
                break
            if cmd[0] == "prime":
                for threads in (1, 4):
                    run("safe_open", st, threads)
                    run("torch_load", pt, threads)
                run("load_file", st, 1)
                print("RESULT {}", flush=True)
            elif cmd[0] == "run" and len(cmd) == 4:
                print("RESULT " + json.dumps(run(cmd[1], cmd[2], int(cmd[3]))), flush=True)
            else:
                print(f"ERROR unknown command {line.strip()!r}", flush=True)
        except Exception as e:  # noqa: BLE001 (the bench reports it and stops)
            print(f"ERROR {type(e).__name__}: {e}".replace("\n", " "), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
