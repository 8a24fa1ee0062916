"""Weighted average of bf16 model.safetensors files of one layout (a
"model soup" of the runs' exported weights), written as bf16 with
round-to-nearest-even. Needs numpy only.

    python3 training/average.py OUT.safetensors RUN9.safetensors:0.5 RUN10.safetensors:0.5

Session 7 averaged runs 9 and 10, and runs 8, 9 and 10 (training/REPORT.md,
"Averaging runs"); neither was shipped.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bf16st  # noqa: E402


def main(out, parts):
    head, _, _ = bf16st.read(parts[0][0])
    assert all(v["dtype"] == "BF16" for v in bf16st.tensors(head).values()), "bf16 files only"
    acc = None
    for path, w in parts:
        h, _, data = bf16st.read(path)
        assert bf16st.tensors(h) == bf16st.tensors(head), f"{path}: another layout"
        f = bf16st.to_f32(data).astype(np.float64) * w
        acc = f if acc is None else acc + f
    bf16st.write(out, head, bf16st.to_bf16(acc.astype(np.float32)).tobytes())


if __name__ == "__main__":
    main(sys.argv[1], [(a.rsplit(":", 1)[0], float(a.rsplit(":", 1)[1])) for a in sys.argv[2:]])
