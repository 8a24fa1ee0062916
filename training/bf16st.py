"""bf16 safetensors files with numpy only (no torch, safetensors or
transformers): what calibrate.py reads, converts and writes."""
import json
import struct

import numpy as np


def read(path):
    """(header dict, header prefix bytes, tensor bytes) of a safetensors file;
    the prefix is the 8-byte length and the JSON, as stored."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[:8 + n], b[8 + n:]


def tensors(header):
    """The header's tensor entries (without __metadata__)."""
    return {k: v for k, v in header.items() if k != "__metadata__"}


def to_f32(raw):
    """bf16 bytes -> float32 array (exact)."""
    return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_bf16(x):
    """float32 array -> bf16 as uint16, rounded to nearest even as torch's
    .to(torch.bfloat16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write(path, header, body):
    """A safetensors file of header (dict) and tensor bytes, the JSON padded
    to 8 bytes."""
    hb = json.dumps(header).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + body)
