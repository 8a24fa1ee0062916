#!/usr/bin/env python3
"""Temperature calibration of an exported model: one scalar s that
multiplies every logit, fitted on the held-out validation pairs (never on
test.tsv) to minimise the lower-line NLL, and baked into the weights.

Why it is a weight edit: the LM head is linear without a bias and runs on
the final RMSNorm's output, so scaling model.norm.weight by s scales every
logit by s. The Go engine, transformers and llama.py then all compute the
calibrated model with no new code. Greedy decoding is unchanged (the argmax
of s·z is the argmax of z for s > 0); only the probabilities move.

Why it is needed: the runs train with residual dropout and export weights
without it, so the exported model is overconfident: the fitted scale is
below 1 (0.853 for the shipped model), and calibrating the uncalibrated
exports lowered the test perplexity by ~0.6 (training/README.md).

    python3 training/calibrate.py weights/chunlian-base --data .carry/chunlian [--dry-run]

Needs PyTorch and numpy, not safetensors or transformers (the bf16 file is
read and patched with numpy), so it also runs on Debian's python3-torch.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bf16st  # noqa: E402
import common as C  # noqa: E402
import llama as L  # noqa: E402
import pairs  # noqa: E402
import valid  # noqa: E402

NORM = "model.norm.weight"


def load_model(model_dir):
    """A float32 llama.Llama from an exported bf16 directory (numpy reader)."""
    cfg = L.cfg_from_hf(json.load(open(os.path.join(model_dir, "config.json"))))
    m = L.Llama(dict(cfg, dropout=0.0))
    head, _, data = bf16st.read(os.path.join(model_dir, "model.safetensors"))
    sd = {}
    for k, meta in head.items():
        if k == "__metadata__" or k == "lm_head.weight":  # tied to the embedding
            continue
        assert meta["dtype"] == "BF16", (k, meta["dtype"])
        a, e = meta["data_offsets"]
        sd[k] = torch.from_numpy(bf16st.to_f32(data[a:e]).reshape(meta["shape"]).copy())
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return m.eval()


def scale_norm(model_dir, s):
    """Multiply model.norm.weight in model_dir/model.safetensors by s (bf16,
    in place; every other byte of the file is kept)."""
    path = os.path.join(model_dir, "model.safetensors")
    head, prefix, data = bf16st.read(path)
    a, e = head[NORM]["data_offsets"]
    body = bytearray(data)
    body[a:e] = bf16st.to_bf16(bf16st.to_f32(data[a:e]) * np.float32(s)).tobytes()
    with open(path + ".tmp", "wb") as f:
        f.write(prefix + bytes(body))
    os.replace(path + ".tmp", path)


def calibrate(model_dir, data_dir, dev=None, dry_run=False, bleu=True, log=print):
    """Fit s on data_dir/pairs_val.tsv.gz and (unless dry_run) bake it into
    model_dir; with bleu, also record the validation BLEU-4 of the result
    (minutes on a CPU: `chunlian eval --test VAL.tsv --bleu-forced 5000` is
    faster there). Returns a dict for train.json / the report."""
    dev = dev or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    chars = json.load(open(os.path.join(data_dir, "vocab.json"), encoding="utf-8"))["chars"]
    v = C.Vocab(chars)
    groups = pairs.to_groups(v, pairs.read_rows(os.path.join(data_dir, "pairs_val.tsv.gz")), False)
    model = load_model(model_dir)
    s, before, after = valid.fit(model, groups, dev)
    out = {"logit_scale": s, "val_lower_nll_before": before, "val_lower_nll_after": after,
           "val_pairs": sum(g.U.shape[0] for g in groups.values())}
    if not dry_run and s != 1.0:
        scale_norm(model_dir, s)
        # The file now holds bf16(norm·s): measure what was written.
        model = load_model(model_dir)
        out["val_lower_nll_written"] = valid.nll_by_scale(model, groups, dev, [1.0])[0]
    # The figure candidates are compared by: docs/EVAL.md's BLEU-4 on the
    # validation pairs (test.tsv is only reported, never chosen on).
    # The scale does not move an argmax, but the bf16 rounding of the scaled
    # norm can break a near-tie, so this is measured on the file's model.
    if bleu:
        out["val_bleu4"] = valid.val_bleu(model.to(dev), groups, dev)["bleu4"]
    log("calibration:", json.dumps(out))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--data", default=".carry/chunlian")
    ap.add_argument("--dry-run", action="store_true", help="fit and print s, leave the weights as they are")
    ap.add_argument("--no-bleu", action="store_true", help="skip the validation BLEU-4 (slow without a GPU)")
    a = ap.parse_args()
    calibrate(a.model_dir, a.data, dry_run=a.dry_run, bleu=not a.no_bleu)


if __name__ == "__main__":
    main()
