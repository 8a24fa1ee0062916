#!/usr/bin/env python3
"""The end of a device call that trained several runs side by side
(training/ab.sh): average their exported weights into one more candidate
(a "model soup" of runs that started from the same weights), and rank all
candidates by the figures docs/EVAL.md defines.

    python3 training/soup.py make --data .carry/chunlian --out SOUP_DIR RUN_DIR...
    python3 training/soup.py rank CANDIDATE_DIR...     # best first, one dir per line

make: SOUP_DIR gets RUN_DIR[0]'s files with the uniform average of the
runs' model.safetensors, recalibrated (calibrate.py: the runs' own logit
scales are averaged along with everything else, so the soup's is refitted),
then evaluated (evaluate.py: eval.json) and given a reference fixture.

rank: by the validation pairs only (test.tsv is reported, never chosen
on): the candidates whose calibrated validation NLL keeps the test
perplexity under 20 come first, by validation BLEU-4 (docs/EVAL.md's
definition on those pairs); then the others. The table goes to stderr.
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from valid import VAL_NLL_BOUND  # noqa: E402


def make(out, runs, data):
    import average
    import calibrate
    import evaluate
    import fixture
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(runs[0]):
        p = os.path.join(runs[0], f)
        if os.path.isfile(p) and f not in ("eval.json", "reference.json", "bench_gpu.json", "model.safetensors"):
            shutil.copy(p, out)
    average.main(os.path.join(out, "model.safetensors"),
                 [(os.path.join(r, "model.safetensors"), 1.0 / len(runs)) for r in runs])
    info = {"runs": runs, "calibration": calibrate.calibrate(out, data)}
    with open(os.path.join(out, "soup.json"), "w") as f:
        json.dump(info, f, indent=1)
    evaluate.evaluate(out, data, out)
    fixture.make(out, data, os.path.join(out, "reference.json"))


def figures(d):
    """{val_bleu4, val_nll, test_bleu4, test_ppl} of a candidate dir (validation
    figures from its calibration record in train.json or soup.json, test
    figures from eval.json), or None if it lacks any of them."""
    cal = None
    for f in ("train.json", "soup.json"):
        p = os.path.join(d, f)
        if os.path.exists(p):
            cal = json.load(open(p)).get("calibration") or cal
    p = os.path.join(d, "eval.json")
    if not cal or "val_bleu4" not in cal or not os.path.exists(p):
        return None
    e = json.load(open(p, encoding="utf-8"))
    return {"val_bleu4": cal["val_bleu4"], "val_nll": cal.get("val_lower_nll_written", cal["val_lower_nll_after"]),
            "test_bleu4": e["bleu_forced_length"]["bleu4"], "test_ppl": e["lower_ppl"]}


def rank(dirs, max_nll=VAL_NLL_BOUND):
    """Best first: candidates whose calibrated validation NLL is at most
    max_nll, by validation BLEU-4, then the others, by the same. The test
    figures are printed, never used to choose."""
    scored = [(d, figures(d)) for d in dirs]
    ok = [(d, f) for d, f in scored if f is not None]
    ok.sort(key=lambda t: (t[1]["val_nll"] > max_nll, -t[1]["val_bleu4"]))
    for d, f in scored:
        if f is None:
            print(f"{d}: no calibration record with val_bleu4, or no eval.json", file=sys.stderr)
    for d, f in ok:
        print(f"{d}: val BLEU-4 {f['val_bleu4']:.5f}, val NLL {f['val_nll']:.4f} (calibrated); "
              f"test BLEU-4 {f['test_bleu4']:.5f}, test perplexity {f['test_ppl']:.3f}", file=sys.stderr)
    return [d for d, _ in ok]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--data", default=".carry/chunlian")
    m.add_argument("--out", required=True)
    m.add_argument("runs", nargs="+")
    r = sub.add_parser("rank")
    r.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    if a.cmd == "make":
        make(a.out, a.runs, a.data)
    else:
        for d in rank(a.dirs):
            print(d)


if __name__ == "__main__":
    main()
