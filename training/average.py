"""Weighted average of bf16 model.safetensors files of one layout (a
"model soup" of the runs' exported weights), written as bf16 with
round-to-nearest-even. Needs numpy only.

    python3 training/average.py OUT.safetensors RUN9.safetensors:0.5 RUN10.safetensors:0.5

Session 7 averaged runs 9 and 10, and runs 8, 9 and 10 (training/REPORT.md,
"Averaging runs"); neither was shipped.
"""
import json
import struct
import sys

import numpy as np


def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def tensors(header):
    return {k: v for k, v in header.items() if k != "__metadata__"}


def main(out, parts):
    head, _ = load(parts[0][0])
    assert all(v["dtype"] == "BF16" for v in tensors(head).values()), "bf16 files only"
    acc = None
    for path, w in parts:
        h, data = load(path)
        assert tensors(h) == tensors(head), f"{path}: another layout"
        f = (np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64) * w
        acc = f if acc is None else acc + f
    a = acc.astype(np.float32).view(np.uint32)
    bf = ((a + 0x7FFF + ((a >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    hb = json.dumps(head).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + bf.tobytes())


if __name__ == "__main__":
    main(sys.argv[1], [(a.rsplit(":", 1)[0], float(a.rsplit(":", 1)[1])) for a in sys.argv[2:]])
