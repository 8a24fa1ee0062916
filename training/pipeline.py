#!/usr/bin/env python3
"""One device call: a fast smoke pass of everything (30 steps on a data
subset, export, eval on 64 pairs, fixture, GPU bench) that fails fast, then
the real run (train for the time left, export, full eval, fixture, bench,
loss plot). Results go to --out ($OUT of the device tool):

    set -o pipefail; PYTHONUNBUFFERED=1 python3 training/pipeline.py --out $OUT 2>&1 | tee $OUT/log

$OUT gets: log, model.safetensors.part-* (split under 16 MiB each; join with
cat), results.tar.gz (the rest of the model dir, curve.csv, train.json,
eval.json, reference.json, bench_gpu.json, loss.png).
"""
import argparse
import glob
import os
import subprocess
import sys
import time
import traceback

T0 = time.time()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpu  # noqa: E402
import evaluate  # noqa: E402
import fixture  # noqa: E402
import train  # noqa: E402


def log(*a):
    print(time.strftime("%H:%M:%S"), f"[{time.time() - T0:.0f}s]", *a, flush=True)


def plot(curve_csv, png):
    import csv
    import math
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = list(csv.DictReader(open(curve_csv)))
    tok = [int(r["tokens"]) / 1e6 for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ax[0].plot(tok, [float(r["train_loss"]) for r in rows], label="train (all targets, mixed modes)")
    ax[0].plot(tok, [float(r["val_loss"]) for r in rows], label="val (lower mode, all targets)")
    ax[0].plot(tok, [float(r["val_lower_nll"]) for r in rows], label="val (lower line + <eos>)")
    ax[0].set_xlabel("tokens seen (M)")
    ax[0].set_ylabel("cross-entropy (nats/token)")
    ax[0].legend()
    ax[0].grid(alpha=.3)
    ax[1].plot(tok, [math.exp(float(r["val_lower_nll"])) for r in rows], color="C2")
    ax[1].set_xlabel("tokens seen (M)")
    ax[1].set_ylabel("val lower-line perplexity")
    ax[1].set_ylim(bottom=0)
    ax[1].grid(alpha=.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def ship(model_dir, out):
    """Split model.safetensors into <16 MiB parts and tar everything else."""
    for p in glob.glob(os.path.join(out, "model.safetensors.part-*")):
        os.remove(p)
    subprocess.run(["split", "-b", "15M", "-d", os.path.join(model_dir, "model.safetensors"),
                    os.path.join(out, "model.safetensors.part-")], check=True)
    files = [f for f in os.listdir(model_dir) if f != "model.safetensors"]
    subprocess.run(["tar", "czf", os.path.join(out, "results.tar.gz"), "-C", model_dir] + files, check=True)
    log("shipped", sorted(os.listdir(out)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=".carry/chunlian")
    ap.add_argument("--work", default="/tmp/chunlian")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--minutes", type=float, default=7.0)
    ap.add_argument("--deadline", type=float, default=580, help="seconds since start by which all must be done")
    ap.add_argument("--post-reserve", type=float, default=75, help="seconds kept for export/eval/fixture/bench")
    ap.add_argument("--skip-smoke", action="store_true")
    ap.add_argument("--smoke-train-only", action="store_true", help="smoke only train+export (eval code unchanged)")
    ap.add_argument("train_args", nargs="*", help="extra train.py flags after --")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cand = "weights/chunlian-base/banner_candidates.txt"
    import torch
    log("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")
    import matplotlib  # noqa: F401  (fail fast if the plot cannot be made)

    if not a.skip_smoke:
        s = os.path.join(a.work, "smoke")
        train.train(train.parse(["--data", a.data, "--out", s, "--candidates", cand, "--steps", "30",
                                 "--smoke", "--eval-every", "10", "--warmup", "10"] + a.train_args))
        if not a.smoke_train_only:
            evaluate.evaluate(s, a.data, s, limit=64, n_samples=2)
            fixture.make(s, a.data, os.path.join(s, "reference.json"))
            bench_gpu.bench(s, os.path.join(s, "bench_gpu.json"), n1=2, runs=1)
            plot(os.path.join(s, "curve.csv"), os.path.join(s, "loss.png"))
        log("SMOKE OK")

    m = os.path.join(a.work, "chunlian-base")
    left = a.deadline - (time.time() - T0) - a.post_reserve - 25  # 25 s: data loading
    minutes = min(a.minutes, left / 60)
    log(f"training for {minutes:.2f} minutes")
    train.train(train.parse(["--data", a.data, "--out", m, "--candidates", cand, "--minutes", f"{minutes:.3f}"] + a.train_args))
    ship(m, a.out)
    for name, fn in [
        ("plot", lambda: plot(os.path.join(m, "curve.csv"), os.path.join(m, "loss.png"))),
        ("fixture", lambda: fixture.make(m, a.data, os.path.join(m, "reference.json"))),
        ("eval", lambda: evaluate.evaluate(m, a.data, m)),
        ("bench", lambda: bench_gpu.bench(m, os.path.join(m, "bench_gpu.json"))),
    ]:
        try:
            t = time.time()
            fn()
            log(f"{name} done in {time.time() - t:.1f}s")
        except Exception:
            traceback.print_exc()
            log(f"{name} FAILED")
        ship(m, a.out)
    log("ALL DONE")


if __name__ == "__main__":
    main()
