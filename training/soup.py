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

rank: the candidates whose eval.json meets the perplexity goal (<= 20)
come first, by test BLEU-4 (the goal that is not met yet); then the others,
by BLEU-4. The ranking table goes to stderr.
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PPL_GOAL = 20.0


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
    """(BLEU-4, perplexity) of a candidate dir, or None without an eval.json."""
    p = os.path.join(d, "eval.json")
    if not os.path.exists(p):
        return None
    e = json.load(open(p, encoding="utf-8"))
    return e["bleu_forced_length"]["bleu4"], e["lower_ppl"]


def rank(dirs):
    scored = [(d, figures(d)) for d in dirs]
    ok = [(d, f) for d, f in scored if f is not None]
    ok.sort(key=lambda t: (t[1][1] > PPL_GOAL, -t[1][0]))
    for d, f in scored:
        if f is None:
            print(f"{d}: no eval.json", file=sys.stderr)
    for d, (b, p) in ok:
        print(f"{d}: BLEU-4 {b:.5f}, perplexity {p:.3f}", file=sys.stderr)
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
