#!/usr/bin/env python3
"""Independent reference for Domino's GGML block code: the `gguf` Python package's numpy
(de)quantizers (pip install gguf; scripts/setup.sh --test installs it).

  gguf-reference.py dequantize TYPE BLOCKS_IN F32_OUT   # raw blocks -> little-endian f32 values
  gguf-reference.py quantize TYPE F32_IN BLOCKS_OUT     # f32 values -> raw blocks (types gguf implements)

TYPE is a GGML type name (Q4_K, Q5_0, ...). crates/engine/tests/quant_reference.rs drives it.
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGML_QUANT_SIZES, quants


def main() -> int:
    mode, name, src, dst = sys.argv[1:5]
    qtype = GGMLQuantizationType[name.upper()]
    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    if mode == "dequantize":
        raw = np.fromfile(src, dtype=np.uint8).reshape(-1, block_bytes)
        quants.dequantize(raw, qtype).astype("<f4").tofile(dst)
    elif mode == "quantize":
        values = np.fromfile(src, dtype="<f4").reshape(-1, block_values)
        quants.quantize(values, qtype).astype(np.uint8).tofile(dst)
    else:
        print(f"unknown mode {mode}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
