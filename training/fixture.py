#!/usr/bin/env python3
"""Write forward/testdata/reference.json: PyTorch float32 CPU logits of the
exported model (bf16 weights widened to fp32, TF32 off) for a few prompts,
for the Go forward-pass test (max |Δlogit| <= 1e-3).

    python3 training/fixture.py --model weights/chunlian-base --data .carry/chunlian --out forward/testdata/reference.json

Format: {"model": "weights/chunlian-base", "cases": [{"tokens": [...],
"rows": [pos, ...], "logits": [[V floats], ...], "argmax": [T ints]}]}:
logits[k] is the full logits row at position rows[k] (the prediction for the
token after tokens[rows[k]]); argmax[t] is the argmax of the row at t.

It also recomputes the logits with an independent plain-PyTorch Llama
(straight from model.safetensors, rotate-half RoPE as in Hugging Face) and
reports the largest difference to transformers' output, so that the fixture
documents the exact math the Go side must reproduce.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), -1)


def plain_llama(model_dir, ids):
    """Logits [T, V] from model.safetensors with no transformers code."""
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    sd = {k: t.float() for k, t in load_file(os.path.join(model_dir, "model.safetensors")).items()}
    d, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KVH = cfg.get("num_key_value_heads") or H
    hd = cfg.get("head_dim") or d // H
    eps = cfg["rms_norm_eps"]
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 10000.0)
    T = len(ids)
    E = sd["model.embed_tokens.weight"]
    x = E[torch.tensor(ids)]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    fr = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    cos, sin = torch.cat((fr, fr), -1).cos(), torch.cat((fr, fr), -1).sin()  # [T, hd]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"], eps)
        q = (h @ sd[p + "self_attn.q_proj.weight"].T).view(T, H, hd).transpose(0, 1)
        k = (h @ sd[p + "self_attn.k_proj.weight"].T).view(T, KVH, hd).transpose(0, 1)
        v = (h @ sd[p + "self_attn.v_proj.weight"].T).view(T, KVH, hd).transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KVH, 0), v.repeat_interleave(H // KVH, 0)
        a = torch.softmax(q @ k.transpose(1, 2) / hd ** 0.5 + mask, -1) @ v  # [H, T, hd]
        x = x + a.transpose(0, 1).reshape(T, H * hd) @ sd[p + "self_attn.o_proj.weight"].T
        h = rms(x, sd[p + "post_attention_layernorm.weight"], eps)
        g = torch.nn.functional.silu(h @ sd[p + "mlp.gate_proj.weight"].T) * (h @ sd[p + "mlp.up_proj.weight"].T)
        x = x + g @ sd[p + "mlp.down_proj.weight"].T
    x = rms(x, sd["model.norm.weight"], eps)
    head = sd.get("lm_head.weight", E)
    return x @ head.T


def fmt(x):
    return float(f"{x:.7g}")


@torch.no_grad()
def make(model_dir, data, out, model_name="weights/chunlian-base", max_bytes=300_000):
    from transformers import AutoModelForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    v = C.model_vocab(model_dir)

    def greedy(ids, n):
        ids = list(ids)
        for _ in range(n):
            nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
            if nxt == C.EOS:
                break
        return ids

    test = [l.rstrip("\n").split("\t") for l in open(os.path.join(data, "test.tsv"), encoding="utf-8")]
    long_pair = next(p for p in test if len(p[0]) >= 18 and all(c in v.stoi for c in p[0] + p[1]))
    kw = greedy(C.prompt_ids(v, "keyword", 7, keyword="平安"), 20)
    low = C.prompt_ids(v, "lower", len(long_pair[0]), long_pair[0]) + v.ids(long_pair[1][:8])
    acr = C.prompt_ids(v, "acrostic", 5, heads="春福") + v.ids("春")
    cases_in = [(kw, [5, len(kw) - 1]), (low, [low.index(C.SEP), len(low) - 1]), (acr, [])]
    cases, worst = [], 0.0
    for toks, rows in cases_in:
        logits = model(input_ids=torch.tensor([toks])).logits[0].float()
        ref = plain_llama(model_dir, toks)
        worst = max(worst, (ref - logits).abs().max().item())
        cases.append({"tokens": toks, "rows": rows,
                      "logits": [[fmt(x) for x in logits[r].tolist()] for r in rows],
                      "argmax": logits.argmax(-1).tolist()})
    doc = {"model": model_name, "cases": cases}
    s = json.dumps(doc, separators=(",", ":"))
    while len(s) > max_bytes:  # drop rows until it fits
        c = max(cases, key=lambda c: len(c["rows"]))
        c["rows"].pop()
        c["logits"].pop()
        s = json.dumps(doc, separators=(",", ":"))
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        f.write(s + "\n")
    info = {"bytes": len(s) + 1, "rows": sum(len(c["rows"]) for c in cases),
            "max_abs_diff_plain_vs_transformers": worst,
            "texts": [v.text(c["tokens"]) for c in cases]}
    print("fixture:", json.dumps(info, ensure_ascii=False), flush=True)
    return info


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="weights/chunlian-base")
    ap.add_argument("--data", default=".carry/chunlian")
    ap.add_argument("--out", default="forward/testdata/reference.json")
    a = ap.parse_args()
    make(a.model, a.data, a.out)
