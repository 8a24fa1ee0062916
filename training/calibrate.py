#!/usr/bin/env python3
"""Temperature calibration of an exported model: one scalar s that
multiplies every logit, fitted on the held-out validation pairs (never on
test.tsv) to minimise the lower-line NLL, and baked into the weights.

Why it is a weight edit: the LM head is linear without a bias and runs on
the final RMSNorm's output, so scaling model.norm.weight by s scales every
logit by s. The Go engine, transformers and llama.py then all compute the
calibrated model with no new code. Greedy decoding is unchanged (the argmax
of s·z is the argmax of z for s > 0); only the probabilities move.

Why it is needed: the runs train with residual dropout 0.3 and export
weights without it, and the exported model is overconfident: on run 10,
s = 0.97 lowered the test NLL by 0.013 nats (REPORT.md, "Calibration").

    python3 training/calibrate.py weights/chunlian-base --data .carry/chunlian [--dry-run]

Needs PyTorch and numpy, not safetensors or transformers (the bf16 file is
read and patched with numpy), so it also runs on Debian's python3-torch.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import llama as L  # noqa: E402

NORM = "model.norm.weight"


def read_st(path):
    """(header dict, raw tensor bytes) of a safetensors file."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def bf16_to_f32(raw):
    return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """Round to nearest even, as torch's .to(torch.bfloat16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def load_model(model_dir):
    """A float32 llama.Llama from an exported bf16 directory (numpy reader)."""
    cfg = L.cfg_from_hf(json.load(open(os.path.join(model_dir, "config.json"))))
    m = L.Llama(dict(cfg, dropout=0.0))
    head, data = read_st(os.path.join(model_dir, "model.safetensors"))
    sd = {}
    for k, meta in head.items():
        if k == "__metadata__" or k == "lm_head.weight":  # tied to the embedding
            continue
        assert meta["dtype"] == "BF16", (k, meta["dtype"])
        a, e = meta["data_offsets"]
        sd[k] = torch.from_numpy(bf16_to_f32(data[a:e]).reshape(meta["shape"]).copy())
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return m.eval()


def scale_norm(model_dir, s):
    """Multiply model.norm.weight in model_dir/model.safetensors by s (bf16,
    in place; every other byte of the file is kept)."""
    path = os.path.join(model_dir, "model.safetensors")
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    a, e = head[NORM]["data_offsets"]
    body = bytearray(b[8 + n:])
    body[a:e] = f32_to_bf16(bf16_to_f32(bytes(body[a:e])) * np.float32(s)).tobytes()
    with open(path + ".tmp", "wb") as f:
        f.write(b[:8 + n] + bytes(body))
    os.replace(path + ".tmp", path)


@torch.no_grad()
def lower_logits(model, groups, dev, rows=256):
    """Yields (logits float32 [b, n+1, V], targets int64 [b, n+1]) of the lower
    line + <eos> of every validation pair, in lower mode, rows at a time."""
    import train  # the training's own sequence layout (lazy: train imports this module)
    model = model.to(dev).eval()
    for n, g in sorted(groups.items()):
        ids, ft = train.sequences(g, n, "lower", np.random.default_rng(0))
        first = ft + n + 1  # L1: after the upper line and <sep>
        for i in range(0, ids.shape[0], rows):
            x = torch.from_numpy(ids[i:i + rows]).long().to(dev)
            with train.amp(dev):
                lg = model(x)
            yield lg[:, first - 1:-1].float(), x[:, first:]


def collect(model, groups, dev):
    """The lower-line logits of every validation pair, kept for the fit:
    [(z float32 [t, V], z of the target float32 [t])] (5,000 pairs: ~1.4 GB)."""
    out = []
    for lg, tgt in lower_logits(model, groups, dev):
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


def calibrate(model_dir, data_dir, dev=None, dry_run=False, log=print):
    """Fit s on data_dir/pairs_val.tsv.gz and (unless dry_run) bake it into
    model_dir. Returns a dict for train.json / the report."""
    import train
    dev = dev or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    chars = json.load(open(os.path.join(data_dir, "vocab.json"), encoding="utf-8"))["chars"]
    v = C.Vocab(chars)
    groups = train.to_groups(v, train.read_rows(os.path.join(data_dir, "pairs_val.tsv.gz")), False)
    model = load_model(model_dir)
    s, before, after = fit(model, groups, dev)
    out = {"logit_scale": s, "val_lower_nll_before": before, "val_lower_nll_after": after,
           "val_pairs": sum(g.U.shape[0] for g in groups.values())}
    if not dry_run and s != 1.0:
        scale_norm(model_dir, s)
        # The file now holds bf16(norm·s): measure what was written.
        out["val_lower_nll_written"] = nll_by_scale(load_model(model_dir), groups, dev, [1.0])[0]
    # The figure training/soup.py ranks candidates by: docs/EVAL.md's BLEU-4
    # on the validation pairs (test.tsv is only reported, never chosen on).
    out["val_bleu4"] = train.val_bleu(load_model(model_dir).to(dev), groups, dev)["bleu4"]
    log("calibration:", json.dumps(out))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--data", default=".carry/chunlian")
    ap.add_argument("--dry-run", action="store_true", help="fit and print s, leave the weights as they are")
    a = ap.parse_args()
    calibrate(a.model_dir, a.data, dry_run=a.dry_run)


if __name__ == "__main__":
    main()
