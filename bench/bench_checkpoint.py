"""The bench model of mount_tests/gen/generate.py (its BENCH case) saved at another rank count, and
optionally with other dimensions, by the generator's own generate_bench; skipped when a current one is
there. Used by bench/run_all.sh (the rank sweep) and bench/s3_bench.py.

    /usr/bin/python3 bench/bench_checkpoint.py RANKS CASE_DIR [VOCAB,HIDDEN,FFN,LAYERS]
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mount_tests", "gen"))
import generate as G  # noqa: E402


def make(final, ranks, dims=None):
    """CASE_DIR `final` holding the bench model at `ranks` ranks (`dims`: vocab, hidden, ffn, layers)."""
    if G.case_is_current(final, G.GEN_VERSION):
        return final
    import torch
    torch.set_num_threads(1)
    shutil.rmtree(final, ignore_errors=True)
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    case = dict(G.BENCH, name=os.path.basename(final), dp=ranks)
    if dims:
        case["dims"] = tuple(dims)
    G.generate_bench(case, tmp)
    os.rename(tmp, final)
    return final


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    make(sys.argv[2], int(sys.argv[1]), [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) == 4 else None)
