"""The training pairs as arrays, and their token layouts: what train.py
trains on and what valid.py measures on. Rows come from the files prep.py
writes (.carry/chunlian/pairs_*.tsv.*); prompts follow common.py (the
contract with the Go engine, model/meta.go)."""
import contextlib
import gzip
import lzma
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402


def amp(dev):
    """bf16 autocast on the GPU, nothing elsewhere."""
    if dev.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class Group:
    """All examples of one line length N from one source, as arrays.
    U, L: int32 [n, N] character ids; K: int32 [n, 6, 2] keyword ids (first
    kn[i] rows valid); kn: int32 [n]; B: int32 [n, 4] banner ids or None."""

    def __init__(self, U, L, K, kn, B=None):
        self.U, self.L, self.K, self.kn, self.B = U, L, K, kn, B


def read_rows(path):
    op = gzip.open if path.endswith(".gz") else lzma.open if path.endswith(".xz") else open
    with op(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t") for line in f]


def read_packed(folder, name):
    """read_rows of folder/name.xz, or of folder/name.gz where there is no
    .xz: prep.py writes the large files as xz to keep the carried tree under
    the device tool's 64 MiB, and an older
    .carry folder still has them gzipped."""
    xz = os.path.join(folder, name + ".xz")
    return read_rows(xz if os.path.exists(xz) else os.path.join(folder, name + ".gz"))


def to_groups(v, rows, with_banner):
    """rows: [upper, lower, (banner,) kws] -> {N: Group}."""
    by_n = {}
    for r in rows:
        by_n.setdefault(len(r[0]), []).append(r)
    out = {}
    for n, rs in by_n.items():
        m = len(rs)
        U = np.array([v.ids(r[0]) for r in rs], dtype=np.int32).reshape(m, n)
        L = np.array([v.ids(r[1]) for r in rs], dtype=np.int32).reshape(m, n)
        K = np.zeros((m, 6, 2), dtype=np.int32)
        kn = np.zeros(m, dtype=np.int32)
        B = np.zeros((m, 4), dtype=np.int32) if with_banner else None
        for i, r in enumerate(rs):
            kws = (r[3] if with_banner else r[2]).split() if len(r) > (3 if with_banner else 2) else []
            kws = [w for w in kws if len(w) == 2][:6]
            kn[i] = len(kws)
            for j, w in enumerate(kws):
                K[i, j] = v.ids(w)
            if with_banner:
                B[i] = v.ids(r[2])
        out[n] = Group(U, L, K, kn, B)
    return out


def subset(g, idx):
    return Group(g.U[idx], g.L[idx], g.K[idx], g.kn[idx], None if g.B is None else g.B[idx])


def sequences(g, n, mode, rng):
    """Token arrays [m, T] for group g in one mode ('lower', 'keyword',
    'acrostic'); returns (ids, first target position)."""
    m = g.U.shape[0]
    col = lambda t: np.full((m, 1), t, dtype=np.int32)  # noqa: E731
    parts = [col(C.BOS)]
    if mode == "lower":
        parts.append(col(C.LOW))
    elif mode == "keyword":
        pick = (rng.random(m) * np.maximum(g.kn, 1)).astype(np.int64)
        parts += [col(C.KW), g.K[np.arange(m), pick]]
    else:
        parts += [col(C.ACR), g.U[:, :1], g.L[:, :1]]
    parts += [col(C.len_id(n)), col(C.UP)]
    first_target = sum(p.shape[1] for p in parts)  # position of U1
    parts += [g.U, col(C.SEP), g.L]
    if g.B is not None:
        parts += [col(C.BAN), g.B]
    parts.append(col(C.EOS))
    return np.concatenate(parts, axis=1), first_target


def lower_prompts(g, n):
    """The lower-mode prompts of group g's pairs, int64 [m, n + 5]:
    <bos> <low> <len_n> <up> U1..Un <sep>, what the greedy, beam and sampled
    decodes of docs/EVAL.md's 下联 start from."""
    ids, ft = sequences(g, n, "lower", None)  # lower mode draws nothing at random
    return torch.from_numpy(ids[:, :ft + n + 1]).long()
