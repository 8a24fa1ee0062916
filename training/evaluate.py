#!/usr/bin/env python3
"""Evaluate an exported chunlian model directory (docs/EVAL.md has the
definitions):

    python3 training/evaluate.py --model weights/chunlian-base --data .carry/chunlian --out eval

1. BLEU (corpus, character tokens, BLEU-1..4, no smoothing) of greedy lower
   decoding on test.tsv with the lower line's length fixed to the upper's:
   at each of the N steps every special token is forbidden.
2. Perplexity of the lower line + end token, teacher-forced, lower mode:
   exp(sum of -log p over the N lower chars and <eos> of every test pair /
   sum of (N + 1)). Test characters outside the vocabulary are <unk> targets.
3. Rule pass rates of unconstrained greedy decoding: lower mode on test.tsv
   (stops at the first special token) and keyword mode on the blessing words
   of common.BLESSINGS (length 7; upper until <sep>, lower until <ban>/<eos>).
4. Banner ranking on the held-out real triples: rank of the true 横批 among
   banners.txt by log P(B1..B4 <eos> | couplet, <ban>).
5. 20 sample couplets (keyword mode, greedy; the 横批 both greedy after a
   forced <ban> and the best of banners.txt + banner_candidates.txt).

Runs in float32 with TF32 off (the Go engine computes in float32).
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def load(model_dir, dev):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).eval()
    return model, C.model_vocab(model_dir)


def read_tsv(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]


@torch.no_grad()
def greedy_batch(model, prompts, steps, forbid_special, dev):
    """prompts: list of equal-length id lists -> LongTensor [b, steps] of
    greedy tokens (KV cache). forbid_special masks ids < NUM_SPECIAL."""
    x = torch.tensor(prompts, device=dev)
    out = model(input_ids=x, use_cache=True)
    pkv, logits = out.past_key_values, out.logits[:, -1]
    res = []
    for t in range(steps):
        if forbid_special:
            logits = logits.clone()
            logits[:, :C.NUM_SPECIAL] = -float("inf")
        nxt = logits.argmax(-1)
        res.append(nxt)
        if t + 1 < steps:
            out = model(input_ids=nxt[:, None], past_key_values=pkv, use_cache=True)
            pkv, logits = out.past_key_values, out.logits[:, -1]
    return torch.stack(res, 1)


@torch.no_grad()
def greedy_one(model, ids, max_new, dev, stop, allowed=None):
    """Greedy continuation of one sequence until a token in stop (included)
    or max_new tokens; allowed(t) -> bool mask over the vocab or None."""
    x = torch.tensor([ids], device=dev)
    out = model(input_ids=x, use_cache=True)
    pkv, logits = out.past_key_values, out.logits[0, -1]
    res = []
    for t in range(max_new):
        if allowed is not None:
            logits = logits.masked_fill(~allowed(t), -float("inf"))
        nxt = int(logits.argmax())
        res.append(nxt)
        if nxt in stop:
            break
        out = model(input_ids=torch.tensor([[nxt]], device=dev), past_key_values=pkv, use_cache=True)
        pkv, logits = out.past_key_values, out.logits[0, -1]
    return res


@torch.no_grad()
def seq_logprob(model, seqs, start, dev, chunk=2048):
    """Sum of log p(token) over positions >= start for equal-length id
    lists."""
    out = []
    for i in range(0, len(seqs), chunk):
        x = torch.tensor(seqs[i:i + chunk], device=dev)
        lp = F.log_softmax(model(input_ids=x).logits[:, start - 1:-1].float(), -1)
        out.append(lp.gather(-1, x[:, start:, None])[..., 0].sum(-1))
    return torch.cat(out)


def by_len(pairs):
    g = {}
    for i, (u, l) in enumerate(pairs):
        g.setdefault(len(u), []).append(i)
    return g


def evaluate(model_dir, data, out, limit=0, n_samples=20):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, v = load(model_dir, dev)
    pz = dict(r[:2] for r in read_tsv(os.path.join(data, "pingze.tsv")))
    test = [(r[0], r[1]) for r in read_tsv(os.path.join(data, "test.tsv"))]
    if limit:
        test = test[:limit]
    res = {"model": model_dir, "test_pairs": len(test)}
    t0 = time.time()

    # 1. BLEU with forced length; 3. unconstrained lower decoding.
    hyps, free = [None] * len(test), [None] * len(test)
    for n, idx in sorted(by_len(test).items()):
        prompts = [C.prompt_ids(v, "lower", n, test[i][0]) for i in idx]
        for s in range(0, len(idx), 1024):
            toks = greedy_batch(model, prompts[s:s + 1024], n, True, dev).tolist()
            for i, t in zip(idx[s:s + 1024], toks):
                hyps[i] = v.text(t)
            toks = greedy_batch(model, prompts[s:s + 1024], n + 4, False, dev).tolist()
            for i, t in zip(idx[s:s + 1024], toks):
                cut = next((k for k, x in enumerate(t) if x < C.NUM_SPECIAL), len(t))
                free[i] = v.text(t[:cut])
    assert all(len(h) == len(u) for h, (u, _) in zip(hyps, test))
    res["bleu_forced_length"] = C.corpus_bleu(hyps, [l for _, l in test])
    res["bleu_unconstrained"] = C.corpus_bleu(free, [l for _, l in test])
    res["rules_lower_forced_length"] = C.rule_rates([C.rule_checks(u, h, pz) for (u, _), h in zip(test, hyps)])
    res["rules_lower_unconstrained"] = C.rule_rates([C.rule_checks(u, h, pz) for (u, _), h in zip(test, free)])
    res["rules_reference"] = C.rule_rates([C.rule_checks(u, l, pz) for u, l in test])
    log(f"bleu: {json.dumps(res['bleu_forced_length'])} ({time.time() - t0:.1f}s)")

    # 2. Perplexity over lower line + <eos>, teacher-forced.
    nll, cnt = 0.0, 0
    for n, idx in sorted(by_len(test).items()):
        seqs = [C.full_ids(v, "lower", test[i][0], test[i][1]) for i in idx]
        start = len(seqs[0]) - n - 1
        nll -= seq_logprob(model, seqs, start, dev).sum().item()
        cnt += len(idx) * (n + 1)
    res["lower_ppl"] = math.exp(nll / cnt)
    res["lower_nll_per_token"] = nll / cnt
    res["lower_ppl_tokens"] = cnt
    log(f"ppl: {res['lower_ppl']:.3f}")
    res["samples_lower"] = [{"upper": u, "reference": l, "forced": h, "unconstrained": f}
                            for (u, l), h, f in list(zip(test, hyps, free))[:10]]

    # 3b/5. Keyword mode, unconstrained greedy, length 7.
    V = len(v)
    no_special = torch.ones(V, dtype=torch.bool, device=dev)
    no_special[:C.NUM_SPECIAL] = False
    banners = [b.strip() for b in open(os.path.join(data, "banners.txt"), encoding="utf-8") if len(b.strip()) == 4]
    cpath = os.path.join(model_dir, "banner_candidates.txt")
    cands = [b.strip() for b in open(cpath, encoding="utf-8")] if os.path.exists(cpath) else []
    pool = sorted(set(b for b in banners + cands if all(c in v.stoi for c in b)))

    def couplet(prompt, n_max=70):
        g = greedy_one(model, prompt, n_max, dev, stop={C.EOS, C.BAN})
        cut = g.index(C.SEP) if C.SEP in g else len(g)
        up = v.text(g[:cut])
        rest = g[cut + 1:]
        end = next((k for k, x in enumerate(rest) if x < C.NUM_SPECIAL), len(rest))
        low = v.text(rest[:end])
        ctx = prompt + v.ids(up) + [C.SEP] + v.ids(low) + [C.BAN]
        b = greedy_one(model, ctx, 4, dev, stop=set(), allowed=lambda t: no_special)
        return up, low, v.text(b), ctx

    kw_rows = []
    for w in (C.BLESSINGS[:4] if limit else C.BLESSINGS):
        up, low, ban, ctx = couplet(C.prompt_ids(v, "keyword", 7, keyword=w))
        kw_rows.append({"keyword": w, "upper": up, "lower": low, "banner_greedy": ban, "ctx": ctx,
                        "rules": C.rule_checks(up, low, pz, w), "length_as_requested": len(up) == 7 and len(low) == 7})
    res["rules_keyword_unconstrained"] = C.rule_rates([r["rules"] for r in kw_rows])
    res["keyword_length_as_requested"] = sum(r["length_as_requested"] for r in kw_rows) / len(kw_rows)
    res["keyword_words"] = len(kw_rows)
    # Best banner among banners.txt + candidates for the samples.
    for r in kw_rows[:n_samples]:
        ctx = r.pop("ctx")
        lp = seq_logprob(model, [ctx + v.ids(b) + [C.EOS] for b in pool], len(ctx), dev)
        top = lp.topk(3).indices.tolist()
        r["banner_ranked"] = [pool[i] for i in top]
    for r in kw_rows[n_samples:]:
        r.pop("ctx")
    res["samples_keyword"] = kw_rows
    acr = []
    for h in ["春福", "新年", "吉祥", "平安", "幸福"]:
        up, low, ban, _ = couplet(C.prompt_ids(v, "acrostic", 7, heads=h))
        acr.append({"heads": h, "upper": up, "lower": low, "banner_greedy": ban,
                    "heads_ok": up[:1] == h[0] and low[:1] == h[1]})
    res["samples_acrostic"] = acr
    log(f"keyword rules: {json.dumps(res['rules_keyword_unconstrained'])}")

    # 4. Banner ranking on held-out triples.
    tri = read_tsv(os.path.join(data, "triples_eval.tsv"))
    pool_b = sorted(set(banners) | set(t[2] for t in tri))
    pool_b = [b for b in pool_b if all(c in v.stoi for c in b)]
    ranks = []
    for u, l, b in tri:
        if b not in pool_b:
            continue
        ctx = C.prompt_ids(v, "lower", len(u), u) + v.ids(l) + [C.BAN]
        lp = seq_logprob(model, [ctx + v.ids(x) + [C.EOS] for x in pool_b], len(ctx), dev)
        ranks.append(1 + int((lp > lp[pool_b.index(b)]).sum()))
    if ranks:
        k = len(pool_b)
        res["banner_ranking"] = {
            "triples": len(ranks), "pool": k, "mrr": sum(1 / r for r in ranks) / len(ranks),
            "recall@1": sum(r <= 1 for r in ranks) / len(ranks),
            "recall@10": sum(r <= 10 for r in ranks) / len(ranks),
            "median_rank": sorted(ranks)[len(ranks) // 2], "chance_mrr": sum(1 / i for i in range(1, k + 1)) / k,
            "ranks": ranks}
        log(f"banner ranking: {json.dumps({x: y for x, y in res['banner_ranking'].items() if x != 'ranks'})}")
    res["eval_seconds"] = round(time.time() - t0, 1)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "eval.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, ensure_ascii=False, indent=1)
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="weights/chunlian-base")
    ap.add_argument("--data", default=".carry/chunlian")
    ap.add_argument("--out", default="eval")
    ap.add_argument("--limit", type=int, default=0)
    a = ap.parse_args()
    evaluate(a.model, a.data, a.out, a.limit)
