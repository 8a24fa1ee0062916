#!/usr/bin/env python3
"""GPU baseline for the CUDA issue: transformers `generate` (greedy, bf16,
KV cache) on keyword prompts of length 7, batch 1 sequentially and one
static batch of 128.

    python3 training/bench_gpu.py --model weights/chunlian-base --out bench_gpu.json
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402


@torch.no_grad()
def bench(model_dir, out, n1=20, runs=3):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    v = C.model_vocab(model_dir)
    prompts = [C.prompt_ids(v, "keyword", 7, keyword=w) for w in C.BLESSINGS]
    kw = dict(max_new_tokens=24, do_sample=False, eos_token_id=C.EOS, pad_token_id=C.PAD)

    def gen(batch):
        x = torch.tensor(batch, device="cuda")
        y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), **kw)
        torch.cuda.synchronize()
        return y

    gen(prompts[:1])
    gen(prompts[:1])
    t = time.perf_counter()
    new = 0
    for i in range(n1):
        y = gen([prompts[i % len(prompts)]])
        new += y.shape[1] - len(prompts[0])
    b1 = (time.perf_counter() - t) / n1
    batch = [prompts[i % len(prompts)] for i in range(128)]
    gen(batch)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        y = gen(batch)
        ts.append(time.perf_counter() - t)
    res = {"what": "transformers generate, greedy, bf16, keyword prompt (6 tokens), max_new_tokens 24",
           "gpu": torch.cuda.get_device_name(), "batch1_ms_per_couplet": b1 * 1e3,
           "batch1_new_tokens_avg": new / n1, "batch128_ms_per_batch": min(ts) * 1e3,
           "batch128_ms_per_couplet": min(ts) * 1e3 / 128, "batch128_new_tokens": y.shape[1] - len(prompts[0]),
           "torch": torch.__version__}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print("bench:", json.dumps(res), flush=True)
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="weights/chunlian-base")
    ap.add_argument("--out", default="bench_gpu.json")
    a = ap.parse_args()
    bench(a.model, a.out)
