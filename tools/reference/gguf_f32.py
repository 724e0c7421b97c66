"""Dequantize every tensor of a GGUF file into a new all-F32 GGUF file (gguf-py only).

Why: llama.cpp's CPU matmuls on Q4_1/Q8_0/F16 weights quantize/convert the
activations too (vec_dot_type), so running llama.cpp on the original file is not
an fp32 reference. On an F32 file every matmul is F32 x F32.

All metadata is copied (same keys, same order, same types) except
general.file_type, which is set to 0 (ALL_F32). Tensor names and shapes are kept.

    python gguf_f32.py IN.gguf OUT.gguf
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np


def _field_value(field):
    import gguf

    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        sub = field.types[1] if len(field.types) > 1 else None
        return field.contents(), vtype, sub
    return field.contents(), vtype, None


def dequantize_to_f32(src: str | os.PathLike, dst: str | os.PathLike, *, log=None) -> dict:
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch=arch)  # writes general.architecture itself

    have_file_type = False
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        val, vtype, sub = _field_value(field)
        if key == "general.file_type":
            val, have_file_type = int(gguf.LlamaFileType.ALL_F32), True
        if key == "general.alignment":
            writer.data_alignment = int(val)
        writer.add_key_value(key, val, vtype, sub_type=sub)
    if not have_file_type:
        writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))

    counts: dict[str, int] = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        want = tuple(int(x) for x in reversed(t.shape.tolist()))
        arr = np.ascontiguousarray(arr.reshape(want))
        writer.add_tensor(t.name, arr, raw_dtype=gguf.GGMLQuantizationType.F32)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if log:
        log(f"dequantized {src} -> {dst} ({len(reader.tensors)} tensors; source types {counts})")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args()
    dequantize_to_f32(a.src, a.dst, log=lambda m: print(m, file=sys.stderr))


if __name__ == "__main__":
    main()
