"""Measurements on the held-out validation pairs (prep.py's pairs_val):
the lower-line NLL that picks checkpoints, docs/EVAL.md's BLEU on them
(train.py --select bleu), and the logit-scale fit that calibrate.py bakes
into the exported weights. Nothing here reads test.tsv."""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
from pairs import amp, lower_prompts, sequences  # noqa: E402

# The calibrated validation NLL a model may have and still be expected to
# meet the test perplexity goal (≤ 20, NLL 2.9957): the test NLL has run
# ~0.024 nats below the validation NLL (2.9878 and 2.9641 for one
# calibrated model). train.py --select bleu holds checkpoints to it.
VAL_NLL_BOUND = 3.015


@torch.no_grad()
def validate(model, val, dev):
    """Lower-mode validation: (mean NLL over U..eos, mean NLL over the lower
    line + <eos> only)."""
    tot_all = n_all = tot_low = n_low = 0.0
    for n, lg, tgt in lower_logits(model, val, dev, first="upper"):
        nll = -F.log_softmax(lg, -1).gather(-1, tgt[..., None])[..., 0]  # [b, T-ft]
        tot_all += nll.sum().item()
        n_all += nll.numel()
        low = nll[:, n + 1:]  # lower line + <eos> (skip U and <sep>)
        tot_low += low.sum().item()
        n_low += low.numel()
    model.train()
    return tot_all / n_all, tot_low / n_low


def val_bleu(model, groups, dev, rows=1024):
    """docs/EVAL.md's BLEU (greedy lower decoding, the 下联's length forced
    to the 上联's, special tokens forbidden) on the validation pairs:
    common.corpus_bleu's dict."""
    return C.corpus_bleu(*val_greedy(model, groups, dev, rows))


@torch.no_grad()
def val_greedy(model, groups, dev, rows=1024):
    """(hypotheses, references): token id lists of the greedy 下联 of every
    pair in groups (by length, in group order) and of the real one.
    Recomputes the whole prefix at every step (no KV cache): a 下联 is a few
    dozen tokens at most."""
    was = model.training
    model.eval()
    hyps, refs = [], []
    for n, g in sorted(groups.items()):
        pre = lower_prompts(g, n).to(dev)
        for i in range(0, pre.shape[0], rows):
            x = pre[i:i + rows]
            for _ in range(n):
                with amp(dev):
                    lg = model(x)[:, -1].float()  # [b, V]
                lg[:, :C.NUM_SPECIAL] = -float("inf")
                x = torch.cat([x, lg.argmax(-1, keepdim=True)], 1)
            hyps += x[:, -n:].tolist()
        refs += g.L.tolist()
    model.train(was)
    return hyps, refs


@torch.no_grad()
def val_calibrated(model, groups, dev):
    """(logit scale, lower-line NLL at that scale) on the validation pairs:
    the NLL the exported model will have after calibrate.py."""
    was = model.training
    s, _, nll = fit_chunks(collect(model, groups, dev))
    model.train(was)
    return s, nll


@torch.no_grad()
def lower_logits(model, groups, dev, rows=256, first="lower"):
    """Yields (n, logits float32 [b, T', V], targets int64 [b, T']) of every
    pair of groups in lower mode, rows at a time (model in eval mode): the
    targets from the lower line (first="lower": L1..Ln <eos>) or from the
    upper line (first="upper": U1..Un <sep> L1..Ln <eos>)."""
    model = model.to(dev).eval()
    for n, g in sorted(groups.items()):
        ids, ft = sequences(g, n, "lower", np.random.default_rng(0))  # ft: U1
        if first == "lower":
            ft += n + 1  # L1: after the upper line and <sep>
        for i in range(0, ids.shape[0], rows):
            x = torch.from_numpy(ids[i:i + rows]).long().to(dev)
            with amp(dev):
                lg = model(x)
            yield n, lg[:, ft - 1:-1].float(), x[:, ft:]


def collect(model, groups, dev):
    """The lower-line logits of every validation pair, kept for the fit:
    [(z float32 [t, V], z of the target float32 [t])] (5,000 pairs: ~1.4 GB)."""
    out = []
    for _, lg, tgt in lower_logits(model, groups, dev):
        z = lg.reshape(-1, lg.shape[-1])
        out.append((z, z.gather(-1, tgt.reshape(-1, 1))[:, 0]))
    return out


def moments(chunks, s):
    """Mean NLL at logit scale s and its first two derivatives in s:
    NLL(s) = logsumexp(s·z) − s·z_t, NLL' = E_p[z] − z_t, NLL'' = Var_p(z) ≥ 0
    (p = softmax(s·z)), so NLL is convex in s and Newton's method finds its
    minimum."""
    f = g = h = 0.0
    n = 0
    for z, zt in chunks:
        sz = z * s
        lse = torch.logsumexp(sz, -1)
        p = torch.exp(sz - lse[:, None])
        ez = (p * z).sum(-1)
        ez2 = (p * z * z).sum(-1)
        f += (lse - s * zt).double().sum().item()
        g += (ez - zt).double().sum().item()
        h += (ez2 - ez * ez).double().sum().item()
        n += zt.numel()
    return f / n, g / n, h / n


def nll_by_scale(model, groups, dev, scales):
    """Mean NLL (nats per token) of the lower lines at each logit scale."""
    chunks = collect(model, groups, dev)
    return [moments(chunks, s)[0] for s in scales]


def fit(model, groups, dev):
    """The NLL-minimising logit scale of model on groups: fit_chunks of its
    lower-line logits."""
    return fit_chunks(collect(model, groups, dev))


def fit_chunks(chunks, tol=1e-5):
    """The NLL-minimising logit scale, by Newton's method from s = 1 with
    step halving (the NLL is convex in s). Returns (s, nll at 1, nll at s)."""
    s = 1.0
    f, g, h = moments(chunks, s)
    at1 = f
    for _ in range(50):
        step = -g / h if h > 0 else -0.1 * math.copysign(1.0, g)
        while True:
            t = max(s + step, 0.5 * s)  # stays positive
            ft, gt, ht = moments(chunks, t)
            if ft <= f or abs(step) < tol:
                break
            step /= 2
        done = abs(t - s) < tol
        s, f, g, h = t, ft, gt, ht
        if done:
            break
    return round(s, 5), at1, f
