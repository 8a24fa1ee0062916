#!/usr/bin/env python3
"""Beam search over the 下联 and sequence-level distillation data.

docs/EVAL.md's BLEU decodes greedily. A model's beam search usually finds
下联s with more of the common n-grams than its greedy path; training a model
on its teacher's beam outputs (Kim & Rush 2016, sequence-level knowledge
distillation) teaches its greedy path to land where the teacher's beam
search lands. This module does the two halves:

    # BLEU of greedy (K=1) and beam (K=4) decoding on the validation pairs;
    # several comma-separated model dirs decode as one ensemble (the mean of
    # their probabilities)
    python3 training/distill.py measure --models weights/chunlian-base --k 1,4 [--limit N]
    # the teacher's beam 下联 of every training pair, in pairs_train's order:
    # "upper<TAB>beam lower" lines (train.py --kd reads them)
    python3 training/distill.py make --models DIR[,DIR...] --k 4 --out kd_train.tsv.xz

Decoding follows docs/EVAL.md: the 下联 has the 上联's length, and every
special token is forbidden at every step; beams are ranked by the summed
log-probability (all have the same length, so no length penalty applies).
A KV cache per model keeps each step to one token per beam. Nothing here
reads test.tsv.
"""
import argparse
import lzma
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import llama as L  # noqa: E402
from pairs import amp, lower_prompts, read_packed, read_rows, to_groups  # noqa: E402


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def _attend(q, k, v, causal):
    # q [B, H, T, hd], k and v [B, H, S, hd] (S ≥ T; the T queries are the
    # last T positions) -> [B, H, T, hd]
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    w = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[2]
        w = w.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(w.float(), -1).to(v.dtype) @ v


def forward_cached(m, ids, cache):
    """llama.Llama m on new tokens ids [B, T] after the positions in cache
    (a list of per-layer (k, v) [B, KVH, P, hd], or None for a prefill, which
    must then be causal over the T tokens). Returns (log-probabilities
    float32 [B, V] of the token after the last one, the extended cache).
    The math is llama.py's Trunk, split at the attention to keep k and v."""
    t = m.model
    P = 0 if cache is None else cache[0][0].shape[2]
    B, T = ids.shape
    cos, sin = t.cos[P:P + T], t.sin[P:P + T]
    x = t.embed_tokens(ids)
    new = []
    for i, layer in enumerate(t.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = a.q_proj(h).view(B, T, a.h, a.hd).transpose(1, 2)
        k = a.k_proj(h).view(B, T, a.kvh, a.hd).transpose(1, 2)
        v = a.v_proj(h).view(B, T, a.kvh, a.hd).transpose(1, 2)
        # RoPE in the dtype of v (bf16 under autocast): the cache is read
        # and copied at every step, so it is kept at half the bytes.
        q = (q * cos + L.rotate_half(q) * sin).to(v.dtype)
        k = (k * cos + L.rotate_half(k) * sin).to(v.dtype)
        if cache is not None:
            k = torch.cat([cache[i][0], k], 2)
            v = torch.cat([cache[i][1], v], 2)
        new.append((k, v))
        rep = a.h // a.kvh
        kr, vr = (k, v) if rep == 1 else (k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))
        o = _attend(q, kr, vr, cache is None)
        x = x + a.o_proj(o.transpose(1, 2).reshape(B, T, a.h * a.hd))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    h = t.norm(x[:, -1])
    return F.log_softmax(m.head(h).float(), -1), new


def ensemble_step(models, ids, caches):
    """log of the mean probability over models (one model: its own
    log-probabilities), and each model's extended cache."""
    outs = [forward_cached(m, ids, c) for m, c in zip(models, caches)]
    lps = [o[0] for o in outs]
    lp = lps[0] if len(lps) == 1 else torch.logsumexp(torch.stack(lps), 0) - math.log(len(lps))
    return lp, [o[1] for o in outs]


@torch.no_grad()
def beam_lower(models, prompts, n, K, dev):
    """The best 下联 of n characters after each prompt (int64 [b, T]:
    <bos> <low> <len_n> <up> U1..Un <sep>) by beam search of width K over
    the summed log-probability, special tokens forbidden. K=1 is greedy.
    Returns (ids int64 [b, n], summed log-probability float32 [b])."""
    b = prompts.shape[0]
    with amp(dev):
        lp, caches = ensemble_step(models, prompts.to(dev), [None] * len(models))
    V = lp.shape[-1]
    # The first step has one live hypothesis per row: expand to K beams
    # after choosing, so that the K first tokens are K different tokens.
    lp[:, :C.NUM_SPECIAL] = -float("inf")
    score, tok = lp.topk(K, -1)  # [b, K]
    rows = torch.arange(b, device=dev).repeat_interleave(K)
    caches = [[(k[rows], v[rows]) for k, v in c] for c in caches]
    out = tok.reshape(-1, 1)  # [b*K, 1]
    for _ in range(n - 1):
        with amp(dev):
            lp, caches = ensemble_step(models, out[:, -1:], caches)
        lp[:, :C.NUM_SPECIAL] = -float("inf")
        tot = (score.reshape(-1, 1) + lp).reshape(b, K * V)
        score, idx = tot.topk(K, -1)  # [b, K]
        src = (torch.arange(b, device=dev)[:, None] * K + idx // V).reshape(-1)
        out = torch.cat([out[src], (idx % V).reshape(-1, 1)], 1)
        caches = [[(k[src], v[src]) for k, v in c] for c in caches]
    return out.reshape(b, K, n)[:, 0], score[:, 0]  # topk is sorted: beam 0 is the best


def decode_groups(models, groups, K, dev, rows=2048, progress=""):
    """(hypotheses, references) as id lists of every pair in groups, in
    sorted-length, group order (as valid.val_greedy). progress: a name to
    log each length's progress under ("" = quiet)."""
    t0 = time.time()
    hyps, refs = [], []
    for n, g in sorted(groups.items()):
        pre = lower_prompts(g, n)
        for i in range(0, pre.shape[0], rows):
            hyps += beam_lower(models, pre[i:i + rows], n, K, dev)[0].tolist()
        refs += g.L.tolist()
        if progress:
            log(f"{progress}: length {n}: {pre.shape[0]} rows; {len(hyps)} in {time.time() - t0:.0f}s")
    return hyps, refs


def load_models(dirs, dev):
    import calibrate
    return [calibrate.load_model(d).to(dev).eval() for d in dirs.split(",")]


def make(models, v, rows, K, dev, out, batch=4096):
    """Writes "upper<TAB>beam lower" for every row, in the rows' order.
    decode_groups returns them by length, each length in row order (as
    to_groups groups them)."""
    t0 = time.time()
    by_n = {}
    for i, r in enumerate(rows):
        by_n.setdefault(len(r[0]), []).append(i)
    hyps, _ = decode_groups(models, to_groups(v, rows, False), K, dev, rows=batch, progress="make")
    res = [None] * len(rows)
    for i, ids in zip((i for _, idx in sorted(by_n.items()) for i in idx), hyps, strict=True):
        res[i] = v.text(ids)
    op = lzma.open if out.endswith(".xz") else open
    with op(out, "wt", encoding="utf-8") as f:
        for r, low in zip(rows, res):
            f.write(f"{r[0]}\t{low}\n")
    log(f"make: wrote {out} ({len(rows)} rows) in {time.time() - t0:.0f}s")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["measure", "make"])
    ap.add_argument("--models", required=True, help="model dirs, comma-separated (several: one ensemble)")
    ap.add_argument("--data", default=".carry/chunlian")
    ap.add_argument("--k", default="1", help="beam widths (measure: a comma-separated list)")
    ap.add_argument("--limit", type=int, default=0, help="measure: the first N validation pairs only")
    ap.add_argument("--out", default="kd_train.tsv.xz")
    a = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    models = load_models(a.models, dev)
    v = C.model_vocab(a.models.split(",")[0])
    if a.what == "measure":
        rows = read_rows(os.path.join(a.data, "pairs_val.tsv.gz"))
        if a.limit:
            rows = rows[:a.limit]
        groups = to_groups(v, rows, False)
        for K in (int(k) for k in a.k.split(",")):
            t0 = time.time()
            b = C.corpus_bleu(*decode_groups(models, groups, K, dev))
            print(f"measure models={a.models} K={K} pairs={len(rows)} bleu4={b['bleu4']:.5f} bleu2={b['bleu2']:.5f} "
                  f"p1..p4={b['p1']:.4f},{b['p2']:.4f},{b['p3']:.4f},{b['p4']:.4f} ({time.time() - t0:.1f}s)",
                  flush=True)
    else:
        make(models, v, read_packed(a.data, "pairs_train.tsv"), int(a.k), dev, a.out)


if __name__ == "__main__":
    main()
