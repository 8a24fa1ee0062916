#!/usr/bin/env python3
"""Print the Markdown tables of docs/EVAL.md from an eval.json written by
training/evaluate.py:  python3 training/eval_md.py training/eval.json"""
import json
import sys

RULES = ["equal_length", "mirrored_punctuation", "tone_up_ze_low_ping", "no_same_char_same_pos",
         "mirrored_repetition", "keyword_present"]


def pct(x):
    return "—" if x is None else f"{100 * x:.1f}%"


def main(path):
    r = json.load(open(path, encoding="utf-8"))
    b = r["bleu_forced_length"]
    print("| metric | value |\n|---|---|")
    for k in ["bleu4", "bleu2", "bleu1", "p1", "p2", "p3", "p4", "bp", "hyp_len", "ref_len"]:
        v = b[k]
        print(f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |")
    print(f"| lower_ppl | {r['lower_ppl']:.3f} |")
    print(f"| lower_nll_per_token | {r['lower_nll_per_token']:.4f} |")
    print(f"| lower_ppl_tokens | {r['lower_ppl_tokens']} |")
    print(f"| bleu4 (unconstrained greedy, stop at first special) | {r['bleu_unconstrained']['bleu4']:.4f} |")
    print()
    cols = [("lower, test.tsv, unconstrained", r["rules_lower_unconstrained"]),
            ("lower, test.tsv, length forced", r["rules_lower_forced_length"]),
            (f"keyword, {r['keyword_words']} words, unconstrained", r["rules_keyword_unconstrained"]),
            ("reference 下联 of test.tsv", r["rules_reference"])]
    print("| rule | " + " | ".join(c for c, _ in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for k in RULES:
        print(f"| {k} | " + " | ".join(pct(d.get(k)) for _, d in cols) + " |")
    print()
    print("| # | keyword | 上联 | 下联 | 横批 (greedy after forced <ban>) | 横批 ranked (top 3 of banners.txt + candidates) | rules failed |")
    print("|---|---|---|---|---|---|---|")
    for i, s in enumerate(r["samples_keyword"][:20]):
        failed = ", ".join(k for k, v in s["rules"].items() if not v) or "—"
        print(f"| {i + 1} | {s['keyword']} | {s['upper']} | {s['lower']} | {s['banner_greedy']} | "
              f"{' / '.join(s.get('banner_ranked', []))} | {failed} |")
    print()
    print("| heads | 上联 | 下联 | 横批 | heads ok |\n|---|---|---|---|---|")
    for s in r["samples_acrostic"]:
        print(f"| {s['heads']} | {s['upper']} | {s['lower']} | {s['banner_greedy']} | {s['heads_ok']} |")
    print()
    br = r.get("banner_ranking")
    if br:
        print("| banner ranking | value |\n|---|---|")
        for k in ["triples", "pool", "mrr", "chance_mrr", "recall@1", "recall@10", "median_rank"]:
            v = br[k]
            print(f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {v} |")


if __name__ == "__main__":
    main(sys.argv[1])
