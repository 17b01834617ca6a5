"""An independent Python re-implementation of how DeepSpeed *loads* a universal checkpoint
(docs/formats/universal.md §7), used to check that a universal tree (DeepSpeed's own or the one ckptfs
serves) really restores every rank's optimizer partitions, for the original DP size and for others.

- ZeRO-0(BF16)/1/2 and pipeline (§7.1, ``load_hp_checkpoint_state_from_checkpoint_dir``): per param group,
  the flat partition of rank r for a new DP size N' is ``[r·Q', (r+1)·Q')`` with ``Q' = ceil(S/2N')·2``;
  every low-precision param overlapping it reads ``zero/<name>/*.pt`` (dict form ``{'cat_dim', 'param'}``
  required, ``step.pt`` a bare value) and copies its fragment to ``hp_start``.  Padding: moments 0, fp32
  keeps its initial value (here NaN, and a mask says which elements were written).
- ZeRO-3 (§7.2, the v0.18.0+ form): every sub-group, DP rank; ``zero/<name>/<key>.pt`` is a bare tensor
  viewed as 1-D, zero-padded to ``N'·p`` (``p = ceil(n/N')``), rank r takes ``[r·p, (r+1)·p)``; the
  partition is the concatenation over the sub-group's params; step from ``optimizer_state.pt``.

Nothing here reads ckptfs code or output formats other than the universal files themselves.  CLI:

    /usr/bin/python3 mount_tests/universal_loader.py TAG_DIR UNIVERSAL_DIR [N' ...]

checks UNIVERSAL_DIR against the training shards of TAG_DIR (N' = W) and the coverage for the other N'.
"""
import collections
import math
import os
import re
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "gen"))
import deepspeed_classes  # noqa: E402

deepspeed_classes.install()

MOMENTS = ("exp_avg", "exp_avg_sq")
KEYS = ("fp32",) + MOMENTS


def _natural_key(s):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _load(path, weights_only=False):
    return torch.load(path, map_location="cpu", weights_only=weights_only)


def numel_of(shape):
    return int(math.prod(shape))


# ----------------------------------------------------------------------------------------------------
# the model's layout (from the model-state files, which a universal dir carries as copies)

class Layout:
    """stage: 3 or '012'; stages: per pipeline stage (one for non-pipeline) a list of param groups (ZeRO-3:
    sub-groups), each an OrderedDict name -> torch.Size, in flat-buffer order."""

    def __init__(self, stage, stages, files):
        self.stage, self.stages, self.files = stage, stages, files

    def names(self):
        """Every trainable name, first occurrence order (lowest stage first)."""
        seen = collections.OrderedDict()
        for groups in self.stages:
            for g in groups:
                for n, s in g.items():
                    seen.setdefault(n, s)
        return seen


def model_layout(directory):
    """Layout from the model-state files in ``directory`` (a tag dir or a universal dir)."""
    files = sorted(os.listdir(directory), key=_natural_key)
    z3 = [f for f in files if re.fullmatch(r"zero_pp_rank_\d+_mp_rank_\d+_model_states\.pt", f)]
    if z3:
        m = _load(os.path.join(directory, "zero_pp_rank_0_mp_rank_00_model_states.pt"))
        return Layout(3, [[collections.OrderedDict(g) for g in m["param_shapes"]]], z3)
    mp = [f for f in files if re.fullmatch(r"mp_rank_\d+_model_states\.pt", f)]
    if not mp:
        raise FileNotFoundError(f"{directory}: no model-state file")
    stages = []
    for f in mp:
        ps = _load(os.path.join(directory, f))["param_shapes"]
        if ps is None:
            ps = slice_mapping_shapes(directory, f)
        if isinstance(ps, dict):
            ps = [ps]
        stages.append([collections.OrderedDict(g) for g in ps])
    return Layout("012", stages, mp)


def layer_file_tensors(tag_dir):
    """A pipeline tag's layer files' tensors, named as PipelineModule names them (layer 0: the tied embed)."""
    out = {}
    for f in sorted(os.listdir(tag_dir), key=_natural_key):
        if re.fullmatch(r"layer_\d+-model_states\.pt", f):
            li = int(f[len("layer_"):].split("-")[0])
            prefix = "tied_modules.embed." if li == 0 else f"{li}."
            for k, v in _load(os.path.join(tag_dir, f), weights_only=True).items():
                out[prefix + k] = v
    return out


def slice_mapping_shapes(directory, model_file):
    """param_shapes of a pipeline + ZeRO-0 BF16_Optimizer stage saved without them (DeepSpeed >= 0.18.5): per
    group the names of param_slice_mappings ordered by start (every DP rank's optimizer file in a tag dir;
    in a universal dir the model-state copy's own state, DP rank 0's), shaped by the layer files (tag dir)
    or by zero/<name>/fp32.pt (universal dir)."""
    optim = sorted((f for f in os.listdir(directory)
                    if re.fullmatch(r"bf16_zero_pp_rank_\d+_" + model_file.replace("model_states", "optim_states"), f)),
                   key=_natural_key)
    states = [_load(os.path.join(directory, f))["optimizer_state_dict"] for f in optim] or \
        [_load(os.path.join(directory, model_file))["optimizer"]]
    layers = layer_file_tensors(directory)
    groups = []
    for g in range(len(states[0]["param_slice_mappings"])):
        names = []
        for st in states:
            for n, _ in sorted(st["param_slice_mappings"][g].items(), key=lambda kv: kv[1].start):
                if n not in names:
                    names.append(n)
        groups.append(collections.OrderedDict(
            (n, layers[n].shape if n in layers else
             _load(os.path.join(directory, "zero", n, "fp32.pt"), weights_only=True)["param"].shape) for n in names))
    return groups


# ----------------------------------------------------------------------------------------------------
# the load side

class Frag:
    """A piece of param ``name``: flat elements [lp_start, lp_start+numel) sit at [hp_start, ...) of the
    rank's partition of group ``group``."""
    __slots__ = ("name", "group", "lp_start", "hp_start", "numel")

    def __init__(self, name, group, lp_start, hp_start, numel):
        self.name, self.group, self.lp_start, self.hp_start, self.numel = name, group, lp_start, hp_start, numel

    def __repr__(self):
        return f"Frag({self.name!r}, g{self.group}, lp {self.lp_start}, hp {self.hp_start}, n {self.numel})"


class RankState:
    """What one DP rank ends up with: per group, fp32 partition (+ mask of written elements), moments,
    step, and the fragment list."""

    def __init__(self, rank):
        self.rank = rank
        self.fp32, self.written, self.frags, self.step = [], [], [], []
        self.state = collections.defaultdict(list)  # key -> per group tensor


def load_param_file(path, form):
    """torch.load of zero/<name>/<key>.pt as DeepSpeed's loader uses it.  form 'dict' (§7.1: obj['param'],
    cat_dim chunk with tp_size 1) or 'bare' (§7.2: tensor.view(-1))."""
    obj = _load(path, weights_only=True)
    if form == "dict":
        if not isinstance(obj, dict):
            raise TypeError(f"{path}: ZeRO-1/2 loader needs the dict form, got {type(obj).__name__}")
        full = obj["param"]
        full = full.chunk(1, dim=obj.get("cat_dim", 0))[0]
        return full.flatten()
    if not torch.is_tensor(obj):
        raise TypeError(f"{path}: ZeRO-3 loader (< v0.19.3) needs a bare tensor, got {type(obj).__name__}")
    return obj.view(-1)


class DirSource:
    """A universal tree on disk (``<dir>/zero/...``), read the way DeepSpeed reads it."""

    def __init__(self, universal_dir, form):
        self.zero_dir, self.form, self.d = os.path.join(universal_dir, "zero"), form, {}
        self._osd = None

    def osd(self):
        if self._osd is None:
            self._osd = _load(os.path.join(self.zero_dir, "optimizer_state.pt"))
        return self._osd

    def names(self):
        return [n for n in os.listdir(self.zero_dir) if os.path.isdir(os.path.join(self.zero_dir, n))]

    def keys_of(self, name):
        """hp keys of a param folder, as load_hp_checkpoint_state finds them (re.search(r'(.+).pt'))."""
        out = []
        for f in sorted(os.listdir(os.path.join(self.zero_dir, name))):
            m = re.search(r"(.+).pt", f)
            if m:
                out.append((m.group(1), f))
        return out

    def get(self, name, fname):
        k = (name, fname)
        if k not in self.d:
            path = os.path.join(self.zero_dir, name, fname)
            if fname == "step.pt":
                self.d[k] = _load(path, weights_only=True)
            else:
                self.d[k] = load_param_file(path, self.form)
        return self.d[k]


class MemorySource:
    """The same, from objects: ``params`` = name -> {key: tensor or step}, ``osd`` = optimizer_state.pt's
    object (e.g. the generator's expectation files)."""

    def __init__(self, params, osd, form):
        self.params, self._osd, self.form = params, osd, form

    def osd(self):
        return self._osd

    def names(self):
        return list(self.params)

    def keys_of(self, name):
        return [(k, f"{k}.pt") for k in sorted(self.params[name])]

    def get(self, name, fname):
        v = self.params[name][fname[:-3]]
        if fname == "step.pt":
            return v
        return v.reshape(-1) if self.form == "dict" else v.view(-1)


def _source(universal, form):
    return universal if hasattr(universal, "keys_of") else DirSource(universal, form)


def rebuild_zero012(universal_dir, groups, N, fill=float("nan")):
    """§7.1 for one pipeline stage (``groups`` = that stage's param_shapes list) and new DP size N.
    Returns [RankState] for r in 0..N-1."""
    cache = _source(universal_dir, "dict")
    osd = cache.osd()
    assert "ds_version" in osd, "optimizer_state.pt lacks ds_version (ZeRO-1/2 loader asserts it)"
    ranks = []
    for r in range(N):
        rs = RankState(r)
        for g, shapes in enumerate(groups):
            S = sum(numel_of(s) for s in shapes.values())
            Q = math.ceil(S / (2 * N)) * 2
            fp32 = torch.full((Q,), fill, dtype=torch.float32)
            written = torch.zeros(Q, dtype=torch.bool)
            frags, steps, pieces = [], [], collections.defaultdict(list)
            off = 0
            for name, shape in shapes.items():
                n = numel_of(shape)
                if off < (r + 1) * Q and off + n > r * Q:
                    fs, fe = max(off, r * Q), min(off + n, (r + 1) * Q)
                    fr = Frag(name, g, fs - off, fs - r * Q, fe - fs)
                    frags.append(fr)
                    for key, fname in cache.keys_of(name):
                        obj = cache.get(name, fname)
                        if key == "step":
                            steps.append(obj)
                            continue
                        piece = obj[fr.lp_start: fr.lp_start + fr.numel]
                        assert piece.numel() == fr.numel, f"{name}/{fname}: {obj.numel()} elements, too short"
                        if key == "fp32":
                            fp32[fr.hp_start: fr.hp_start + fr.numel] = piece
                            written[fr.hp_start: fr.hp_start + fr.numel] = True
                        else:
                            pieces[key].append((fr, piece))
                off += n
            for s in steps[1:]:
                assert torch.equal(torch.as_tensor(s), torch.as_tensor(steps[0])), f"rank {r} group {g}: steps differ"
            rs.step.append(steps[0] if steps else None)
            for key in sorted(set(MOMENTS) | set(pieces)):  # a rank with no fragment still gets zero buffers
                lst = pieces.get(key, [])
                buf = torch.zeros(Q, dtype=lst[0][1].dtype if lst else torch.float32)
                for fr, piece in lst:
                    buf[fr.hp_start: fr.hp_start + fr.numel] = piece
                rs.state[key].append(buf)
            rs.fp32.append(fp32)
            rs.written.append(written)
            rs.frags.append(frags)
        ranks.append(rs)
    return ranks


def rebuild_zero3(universal_dir, subgroups, N):
    """§7.2 (v0.18.0+: every sub-group, DP rank) for new DP size N.  Returns [RankState]."""
    cache = _source(universal_dir, "bare")
    step = cache.osd()["optimizer_state_dict"]["state"][0]["step"]
    ranks = []
    for r in range(N):
        rs = RankState(r)
        for i, shapes in enumerate(subgroups):
            frags, parts = [], collections.defaultdict(list)
            written = []
            hp = 0
            for name, shape in shapes.items():
                n = numel_of(shape)
                p = math.ceil(n / N)
                real = max(0, min(p, n - r * p))
                if real:
                    frags.append(Frag(name, i, r * p, hp, real))
                w = torch.zeros(p, dtype=torch.bool)
                w[:real] = True
                written.append(w)
                for key in KEYS:
                    t = cache.get(name, f"{key}.pt")
                    assert t.numel() == n, f"{name}/{key}.pt: {t.numel()} elements, param has {n}"
                    t = torch.cat([t, torch.zeros(N * p - n, dtype=t.dtype)])
                    parts[key].append(t[r * p: r * p + p])
                hp += p
            for key in KEYS:
                flat = torch.cat(parts[key]) if parts[key] else torch.zeros(0)
                if key == "fp32":
                    rs.fp32.append(flat)
                else:
                    rs.state[key].append(flat)
            rs.written.append(torch.cat(written) if written else torch.zeros(0, dtype=torch.bool))
            rs.frags.append(frags)
            rs.step.append(step)
        ranks.append(rs)
    return ranks


def form_of(layout):
    return "bare" if layout.stage == 3 else "dict"


def rebuild(universal_dir, layout, N):
    """Per pipeline stage a [RankState] list.  ``universal_dir``: a path or a DirSource/MemorySource."""
    universal_dir = _source(universal_dir, form_of(layout))
    if layout.stage == 3:
        return [rebuild_zero3(universal_dir, layout.stages[0], N)]
    return [rebuild_zero012(universal_dir, groups, N) for groups in layout.stages]


# ----------------------------------------------------------------------------------------------------
# checks

def merged_from_universal(universal, names, form):
    """name -> {key: flat tensor} read straight from zero/<name>/<key>.pt."""
    src = _source(universal, form)
    return {n: {k: src.get(n, f"{k}.pt") for k in KEYS} for n in names}


def check_coverage(stage_ranks, layout, merged):
    """Every element of every param of every stage appears exactly once across the ranks of that stage,
    and the rebuilt fp32 / moments there equal ``merged`` (name -> {key: flat tensor}).  Padding: moments
    are zero (ZeRO-1/2) / the zero padding (ZeRO-3).  Returns the number of elements checked."""
    checked = 0
    for stage, (ranks, groups) in enumerate(zip(stage_ranks, layout.stages)):
        for g, shapes in enumerate(groups):
            seen = {n: torch.zeros(numel_of(s), dtype=torch.int32) for n, s in shapes.items()}
            for rs in ranks:
                covered = torch.zeros(rs.fp32[g].numel(), dtype=torch.bool)
                for fr in rs.frags[g]:
                    assert fr.group == g
                    seen[fr.name][fr.lp_start: fr.lp_start + fr.numel] += 1
                    covered[fr.hp_start: fr.hp_start + fr.numel] = True
                    for key in KEYS:
                        got = rs.fp32[g] if key == "fp32" else rs.state[key][g]
                        got = got[fr.hp_start: fr.hp_start + fr.numel]
                        exp = merged[fr.name][key][fr.lp_start: fr.lp_start + fr.numel]
                        if not _bits_equal(got, exp):
                            raise AssertionError(f"stage {stage} rank {rs.rank} group {g} {fr.name} {key}: "
                                                 f"elements [{fr.lp_start}, +{fr.numel}) differ")
                    checked += fr.numel
                assert torch.equal(covered, rs.written[g]), \
                    f"stage {stage} rank {rs.rank} group {g}: written elements are not exactly the fragments"
                for key in MOMENTS:
                    pad = rs.state[key][g][~covered]
                    assert not pad.any(), f"stage {stage} rank {rs.rank} group {g} {key}: non-zero padding"
            for n, cnt in seen.items():
                bad = (cnt != 1).nonzero()
                assert len(bad) == 0, f"stage {stage} group {g} {n}: element {int(bad[0])} appears " \
                                      f"{int(cnt[bad[0]])} times across {len(ranks)} ranks"
    return checked


def _bits_equal(a, b):
    a, b = a.contiguous().view(-1), b.contiguous().view(-1)
    if a.dtype != b.dtype or a.numel() != b.numel():
        return False
    return a.view(torch.uint8).numpy().tobytes() == b.view(torch.uint8).numpy().tobytes()


def shard_partitions(tag_dir, layout):
    """The training shards' own partitions, per stage, per rank: {'fp32': [per group], 'exp_avg': [...],
    'exp_avg_sq': [...], 'step': [...]}, and W."""
    files = sorted(os.listdir(tag_dir), key=_natural_key)
    optim = [f for f in files if re.fullmatch(r"(bf16_|fp16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt", f)]
    out = []
    for s in range(len(layout.stages)):
        mine = sorted((f for f in optim if f.endswith(f"_mp_rank_{s:02d}_optim_states.pt")),
                      key=lambda f: int(re.search(r"pp_rank_(\d+)_", f).group(1)))
        ranks = []
        for f in mine:
            o = _load(os.path.join(tag_dir, f))["optimizer_state_dict"]
            if layout.stage == 3:
                st = o["optimizer_state_dict"]["state"]
                ranks.append({"fp32": list(o["fp32_flat_groups"]),
                              "exp_avg": [st[i]["exp_avg"] for i in range(len(o["fp32_flat_groups"]))],
                              "exp_avg_sq": [st[i]["exp_avg_sq"] for i in range(len(o["fp32_flat_groups"]))],
                              "step": [st[i]["step"] for i in range(len(o["fp32_flat_groups"]))]})
            else:
                st = o["base_optimizer_state"]["state"]
                G = len(o["single_partition_of_fp32_groups"])
                ranks.append({"fp32": list(o["single_partition_of_fp32_groups"]),
                              "exp_avg": [st[g]["exp_avg"] for g in range(G)],
                              "exp_avg_sq": [st[g]["exp_avg_sq"] for g in range(G)],
                              "step": [st[g].get("step") for g in range(G)]})
        out.append(ranks)
    return out


def check_against_shards(universal_dir, tag_dir, layout=None):
    """Rebuild with N' = W and compare with the training shards on every real element (elements that
    belong to a param).  For pipeline, a name already held by a lower stage (a tied replica) is compared
    with the universal file instead (the tree keeps the lowest stage's copy).  Returns counts."""
    layout = layout or model_layout(tag_dir)
    universal_dir = _source(universal_dir, form_of(layout))
    shards = shard_partitions(tag_dir, layout)
    W = len(shards[0])
    stage_ranks = rebuild(universal_dir, layout, W)
    owner = {}
    for s, groups in enumerate(layout.stages):
        for g in groups:
            for n in g:
                owner.setdefault(n, s)
    form = "bare" if layout.stage == 3 else "dict"
    merged = merged_from_universal(universal_dir, list(layout.names()), form)
    compared, replica = 0, 0
    for s, (ranks, orig) in enumerate(zip(stage_ranks, shards)):
        assert len(ranks) == len(orig) == W, f"stage {s}: {len(orig)} ranks, stage 0 has {W}"
        for rs, o in zip(ranks, orig):
            for g in range(len(layout.stages[s])):
                for fr in rs.frags[g]:
                    for key in KEYS:
                        got = (rs.fp32[g] if key == "fp32" else rs.state[key][g])[fr.hp_start: fr.hp_start + fr.numel]
                        if owner[fr.name] != s:
                            exp = merged[fr.name][key][fr.lp_start: fr.lp_start + fr.numel]
                        else:
                            src = o[key][g]
                            assert src.numel() >= fr.hp_start + fr.numel, \
                                f"stage {s} rank {rs.rank} group {g} {key}: shard has {src.numel()} elements"
                            exp = src[fr.hp_start: fr.hp_start + fr.numel]
                        if not _bits_equal(got, exp.to(got.dtype) if exp.dtype != got.dtype else exp):
                            raise AssertionError(f"stage {s} rank {rs.rank} group {g} {fr.name} {key}: rebuilt "
                                                 f"partition differs from the shard at hp [{fr.hp_start}, +{fr.numel})")
                    if owner[fr.name] != s:
                        replica += fr.numel
                    else:
                        compared += fr.numel
                if layout.stage != 3 and o["step"][g] is not None:
                    assert torch.equal(torch.as_tensor(rs.step[g]), torch.as_tensor(o["step"][g])), \
                        f"stage {s} rank {rs.rank} group {g}: step {rs.step[g]} vs shard {o['step'][g]}"
                if layout.stage == 3:
                    assert torch.equal(torch.as_tensor(rs.step[g]), torch.as_tensor(o["step"][0]))
                    assert rs.fp32[g].numel() == o["fp32"][g].numel(), \
                        f"rank {rs.rank} sub-group {g}: rebuilt {rs.fp32[g].numel()} elements, shard " \
                        f"{o['fp32'][g].numel()}"
    total = sum(numel_of(s) for s in layout.names().values())
    return {"W": W, "elements_compared": compared, "replica_elements": replica, "params": len(layout.names()),
            "param_elements": total}


def check_resharding(universal_dir, layout, sizes):
    """check_coverage for each new DP size in ``sizes``; returns {N': elements checked}."""
    form = form_of(layout)
    universal_dir = _source(universal_dir, form)
    merged = merged_from_universal(universal_dir, list(layout.names()), form)
    return {N: check_coverage(rebuild(universal_dir, layout, N), layout, merged) for N in sizes}


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    tag_dir, udir = argv[0], argv[1]
    layout = model_layout(tag_dir)
    res = check_against_shards(udir, tag_dir, layout)
    W = res["W"]
    sizes = [int(x) for x in argv[2:]] or sorted({1, 2, 3, W, 2 * W})
    cov = check_resharding(udir, layout, sizes)
    print(f"{udir}: N'=W={W} equals the shards on {res['elements_compared']} elements "
          f"({res['replica_elements']} tied-replica elements checked against the tree); "
          f"coverage OK for N' in {sizes}: {cov}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
