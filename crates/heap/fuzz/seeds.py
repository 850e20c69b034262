#!/usr/bin/env python3
"""Writes the committed seeds of the safetensors_header fuzz target.

Each seed is one byte (buffer size in pages, minus one) and a whole
safetensors file: the 8-byte little-endian header length, the JSON
header, the tensors' bytes. Valid files of mixed dtypes, and the hostile
headers the loader's tests refuse. Run from crates/heap/fuzz:
    python3 seeds.py && git add -f corpus/safetensors_header
"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors_header")
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
         "I8": 1, "U8": 1, "BOOL": 1, "U16": 2, "U32": 4, "U64": 8}


def file_of(tensors, metadata=None, pad=0):
    """tensors: [(name, dtype, shape)], laid out in order."""
    header, off = {}, 0
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(raw)) + raw + bytes(i % 251 for i in range(off))


def raw(header_obj, data_len, length=None):
    h = json.dumps(header_obj).encode()
    n = len(h) if length is None else length
    return struct.pack("<Q", n) + h + bytes(data_len)


SEEDS = {
    "mixed": (0, file_of([("a", "F32", [4, 4]), ("b", "U8", [3]), ("c", "F64", [5]),
                          ("d", "BF16", [7, 3])], {"format": "pt"})),
    "aligned-header": (3, file_of([("w", "F32", [1024]), ("x", "I64", [9])], pad=5)),
    "big-over-cap": (0, file_of([("small", "I8", [10]), ("big", "F16", [3000]),
                                 ("tail", "U32", [2])])),
    "empty": (1, file_of([])),
    "zero-size": (2, file_of([("e", "F32", [0]), ("f", "U16", [4])])),
    "overlap": (0, raw({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, 12)),
    "past-end": (0, raw({"a": {"dtype": "U8", "shape": [64], "data_offsets": [0, 64]}}, 8)),
    "huge-length": (0, struct.pack("<Q", 1 << 60) + b"{}"),
    "shape-mismatch": (0, raw({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, 8)),
    "unknown-dtype": (0, raw({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, 1)),
    "short": (0, b"\x05\x00\x00"),
}

os.makedirs(OUT, exist_ok=True)
for name, (pages, body) in SEEDS.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(bytes([pages]) + body)
print(f"{len(SEEDS)} seeds in {OUT}")
