#!/usr/bin/env python3
"""Rewrite a safetensors file's F32 tensors as F16 (other dtypes are copied as they are).

    python3 scripts/safetensors-f16.py IN.safetensors OUT.safetensors

Plain Python (struct's IEEE half format, round-to-nearest-even like Rust's half::f16::from_f32 that
the engine applies when it uploads f32 weights as f16), so the shipped drafter halves in size and
loads to the same GPU weights.
"""
import json
import struct
import sys


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    out_header, chunks, offset = {}, [], 0
    for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
        t = header[name]
        a, b = t["data_offsets"]
        raw = data[a:b]
        dtype = t["dtype"]
        if dtype == "F32":
            count = len(raw) // 4
            raw = struct.pack(f"<{count}e", *struct.unpack(f"<{count}f", raw))
            dtype = "F16"
        out_header[name] = {"dtype": dtype, "shape": t["shape"], "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if meta is not None:
        out_header["__metadata__"] = meta
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


if __name__ == "__main__":
    main()
