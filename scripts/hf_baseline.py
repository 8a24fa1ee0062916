#!/usr/bin/env python3
"""Hugging Face transformers baseline for the H200 benchmark.

Loads the same weights chunlian serves (weights/chunlian-base: config.json,
model.safetensors, tokenizer.json, chunlian.json) with transformers'
LlamaForCausalLM and times `generate` (greedy, KV cache) the way the seed's
stack ran it:

  * sequential, batch 1   - one request at a time (the seed's "before");
  * static batching       - one padded batch of B prompts per generate call.

Two tasks:
  * lower:  "<bos> <low> <len_N> <up> {upper} <sep>" -> the N-token 下联
            (exactly N new tokens; the issue's calibration: 8-token lines);
  * couplet: "<bos> <kw> {keyword} <len_7> <up>" -> upper, <sep>, lower,
            <ban>, banner, <eos> (up to --couplet-tokens new tokens; the
            same request shape as chunlian's POST /generate keyword mode).

GPU utilisation and memory are sampled with NVML (nvidia-ml-py) while each
case runs. Prints a Markdown table and writes --json.

    python3 scripts/hf_baseline.py --model weights/chunlian-base \
        --batches 128,1024 --seq-requests 50 --json hf.json
"""
import argparse
import json
import os
import statistics
import threading
import time

import torch


def load_vocab(model_dir):
    tj = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))
    vocab = dict(tj["model"]["vocab"])
    for t in tj.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    meta = json.load(open(os.path.join(model_dir, "chunlian.json"), encoding="utf-8"))
    return vocab, meta


class Prompts:
    def __init__(self, model_dir):
        self.vocab, self.meta = load_vocab(model_dir)
        sp = self.meta["special_tokens"]
        self.sp = {k: self.vocab[v] for k, v in sp.items()}
        self.len_fmt = self.meta["length_token"].replace("%d", "{}")

    def chars(self, s):
        unk = self.sp.get("unk", 1)
        return [self.vocab.get(c, unk) for c in s]

    def lower(self, upper):
        return [self.sp["bos"], self.sp["lower"], self.vocab[self.len_fmt.format(len(upper))],
                self.sp["up"]] + self.chars(upper) + [self.sp["sep"]]

    def keyword(self, kw, n=7):
        return [self.sp["bos"], self.sp["keyword"]] + self.chars(kw) + \
               [self.vocab[self.len_fmt.format(n)], self.sp["up"]]


UPPERS = ["春回大地千山秀", "福满人间万户春", "一帆风顺年年好", "万事如意步步高",
          "百世岁月当代好", "千古江山今朝新", "喜居宝地千年旺", "福照家门万事兴",
          "天增岁月人增寿", "春满乾坤福满门", "风调雨顺家家乐", "国泰民安处处春"]
KEYWORDS = ["平安", "富贵", "吉祥", "如意", "春风", "福星", "新年", "团圆",
            "瑞雪", "丰收", "康宁", "喜庆", "兴旺", "和顺", "长寿", "鸿运"]


class GPUSampler:
    """Samples NVML utilisation and memory every 50 ms in a thread."""

    def __init__(self):
        self.util, self.mem = [], []
        self.ok = False
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nv = pynvml
            self.h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            self.ok = True
        except Exception as e:  # no NVML: report without utilisation
            print("NVML unavailable:", e)

    def __enter__(self):
        self.stop = threading.Event()
        self.util, self.mem = [], []
        if self.ok:
            self.t = threading.Thread(target=self.run, daemon=True)
            self.t.start()
        return self

    def run(self):
        while not self.stop.is_set():
            self.util.append(self.nv.nvmlDeviceGetUtilizationRates(self.h).gpu)
            self.mem.append(self.nv.nvmlDeviceGetMemoryInfo(self.h).used)
            time.sleep(0.05)

    def __exit__(self, *a):
        self.stop.set()
        if self.ok:
            self.t.join()

    def summary(self):
        if not self.util:
            return {}
        return {"gpu_util_mean": statistics.mean(self.util), "gpu_util_max": max(self.util),
                "gpu_mem_used_max": max(self.mem)}


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="weights/chunlian-base")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--tasks", default="lower,couplet")
    ap.add_argument("--seq-requests", type=int, default=50, help="requests in the sequential batch-1 case")
    ap.add_argument("--batches", default="128,1024", help="static batch sizes")
    ap.add_argument("--batch-repeats", type=int, default=5)
    ap.add_argument("--lower-len", type=int, default=8, help="tokens of the generated 下联 (lower task)")
    ap.add_argument("--couplet-tokens", type=int, default=24, help="max new tokens of the couplet task")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    from transformers import AutoModelForCausalLM
    import transformers
    dtype = getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).cuda().eval()
    P = Prompts(a.model)
    eos, pad = P.sp["eos"], P.sp.get("pad", 0)
    nparams = sum(p.numel() for p in model.parameters())
    info = {"model": a.model, "params": nparams, "dtype": a.dtype, "torch": torch.__version__,
            "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name()}
    print(json.dumps(info))

    def prompts_for(task, n):
        out = []
        for i in range(n):
            if task == "lower":
                u = UPPERS[i % len(UPPERS)]
                u = (u * 2)[:a.lower_len]
                out.append(P.lower(u))
            else:
                out.append(P.keyword(KEYWORDS[i % len(KEYWORDS)]))
        return out

    def gen_kwargs(task):
        if task == "lower":
            return dict(max_new_tokens=a.lower_len, min_new_tokens=a.lower_len, do_sample=False,
                        pad_token_id=pad, eos_token_id=eos)
        return dict(max_new_tokens=a.couplet_tokens, do_sample=False, pad_token_id=pad, eos_token_id=eos)

    def run(batch, kw):
        # Left padding, as generate expects for decoder-only models.
        L = max(len(p) for p in batch)
        ids = torch.full((len(batch), L), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), L), dtype=torch.long)
        for i, p in enumerate(batch):
            ids[i, L - len(p):] = torch.tensor(p)
            mask[i, L - len(p):] = 1
        ids, mask = ids.cuda(), mask.cuda()
        y = model.generate(input_ids=ids, attention_mask=mask, **kw)
        torch.cuda.synchronize()
        return y[:, L:]

    def new_tokens(y):
        n = 0
        for row in y.tolist():
            for t in row:
                n += 1
                if t == eos:
                    break
        return n

    results = []
    for task in a.tasks.split(","):
        kw = gen_kwargs(task)
        run(prompts_for(task, 2), kw)  # warm-up (CUDA context, kernels, cuBLAS)
        run(prompts_for(task, 1), kw)
        # Sequential batch 1.
        ps = prompts_for(task, a.seq_requests)
        lat, toks = [], 0
        with GPUSampler() as g:
            t0 = time.perf_counter()
            for p in ps:
                t = time.perf_counter()
                toks += new_tokens(run([p], kw))
                lat.append(time.perf_counter() - t)
            wall = time.perf_counter() - t0
        r = {"task": task, "mode": "sequential", "batch": 1, "requests": len(ps), "wall_s": wall,
             "lines_per_s": len(ps) / wall, "tokens_per_s": toks / wall,
             "latency_ms_mean": 1000 * statistics.mean(lat), "latency_ms_p50": 1000 * pct(lat, 50),
             "latency_ms_p99": 1000 * pct(lat, 99), **g.summary()}
        results.append(r)
        print(json.dumps(r))
        for B in [int(x) for x in a.batches.split(",") if x]:
            ps = prompts_for(task, B)
            run(ps, kw)  # warm-up at this shape
            lat, toks = [], 0
            with GPUSampler() as g:
                t0 = time.perf_counter()
                for _ in range(a.batch_repeats):
                    t = time.perf_counter()
                    toks += new_tokens(run(ps, kw))
                    lat.append(time.perf_counter() - t)
                wall = time.perf_counter() - t0
            r = {"task": task, "mode": "static", "batch": B, "requests": B * a.batch_repeats, "wall_s": wall,
                 "lines_per_s": B * a.batch_repeats / wall, "tokens_per_s": toks / wall,
                 "latency_ms_mean": 1000 * statistics.mean(lat), "latency_ms_p50": 1000 * pct(lat, 50),
                 "latency_ms_p99": 1000 * pct(lat, 99), **g.summary()}
            results.append(r)
            print(json.dumps(r))

    print("\n| task | mode | batch | lines/s | tokens/s | latency p50 ms | p99 ms | GPU util mean % | GPU mem max MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print("| {task} | {mode} | {batch} | {lps:,.0f} | {tps:,.0f} | {p50:.1f} | {p99:.1f} | {u} | {m} |".format(
            task=r["task"], mode=r["mode"], batch=r["batch"], lps=r["lines_per_s"], tps=r["tokens_per_s"],
            p50=r["latency_ms_p50"], p99=r["latency_ms_p99"],
            u="%.0f" % r["gpu_util_mean"] if "gpu_util_mean" in r else "-",
            m="%.0f" % (r["gpu_mem_used_max"] / 2**20) if "gpu_mem_used_max" in r else "-"))
    if a.json:
        json.dump({"info": info, "results": results}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
