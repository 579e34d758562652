#!/usr/bin/python3
"""Independent safetensors reader and reference-style writer (numpy only, no safetensors package).

Used by tests/unit/safetensors_interop_test.cpp to check MergePipe against a second
implementation written from the format description, not from MergePipe's code.

  st_interop.py read FILE            validate FILE and print a JSON description of it
  st_interop.py write FILE --seed S  write a file of every dtype the way the reference writer
                                     does, then print the same description of what was written

The description: {"header_length": N, "metadata": {...}, "tensors": [{"name", "dtype", "shape",
"begin", "end", "fnv1a64", "values"}]} with tensors in offset order, `fnv1a64` the FNV-1a 64-bit
hash of the raw bytes (16 hex digits) and `values` the decoded elements as strings: repr() of the
float for F64/F32/F16/BF16, the integer otherwise (F8 types as their raw byte).
Invalid files: a message on stderr and exit status 2.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

MAX_HEADER = 100_000_000

# name -> (element size, numpy little-endian storage type)
DTYPES = {
    "F64": (8, "<f8"), "F32": (4, "<f4"), "F16": (2, "<f2"), "BF16": (2, "<u2"),
    "I64": (8, "<i8"), "I32": (4, "<i4"), "I16": (2, "<i2"), "I8": (1, "<i1"),
    "U64": (8, "<u8"), "U32": (4, "<u4"), "U16": (2, "<u2"), "U8": (1, "<u1"),
    "BOOL": (1, "<u1"), "F8_E4M3": (1, "<u1"), "F8_E5M2": (1, "<u1"),
}
# The reference writer's Dtype enum order; files list tensors by descending rank, then name.
RANK = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32",
        "F32", "F64", "I64", "U64"]


class Invalid(Exception):
    pass


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise Invalid("duplicate key %r" % k)
        seen[k] = v
    return seen


def is_count(x):
    return type(x) is int and 0 <= x < 2**64  # bool is a subclass of int: excluded


def decode(dtype, raw):
    storage = np.frombuffer(raw, dtype=DTYPES[dtype][1])
    if dtype == "BF16":
        return [repr(float(v)) for v in (storage.astype("<u4") << 16).view("<f4")]
    if dtype in ("F64", "F32", "F16"):
        return [repr(float(v)) for v in storage]
    return [str(int(v)) for v in storage]


def describe(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise Invalid("file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER:
        raise Invalid("header length %d too large" % n)
    if 8 + n > len(blob):
        raise Invalid("header length %d beyond the file" % n)
    try:
        text = blob[8:8 + n].decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        raise Invalid("header not UTF-8: %s" % e)
    try:
        header = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as e:
        raise Invalid("header not JSON: %s" % e)
    if not isinstance(header, dict):
        raise Invalid("header not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise Invalid("__metadata__ is not an object of strings")
    entries = []
    for name, e in header.items():
        if not isinstance(e, dict):
            raise Invalid("%s: entry not an object" % name)
        dtype, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if dtype not in DTYPES:
            raise Invalid("%s: bad dtype %r" % (name, dtype))
        if not isinstance(shape, list) or not all(is_count(d) for d in shape):
            raise Invalid("%s: bad shape %r" % (name, shape))
        if not isinstance(offs, list) or len(offs) != 2 or not all(is_count(o) for o in offs):
            raise Invalid("%s: bad data_offsets %r" % (name, offs))
        entries.append((offs[0], offs[1], name, dtype, shape))
    entries.sort()
    data = blob[8 + n:]
    pos = 0
    tensors = []
    for begin, end, name, dtype, shape in entries:
        if begin != pos or end < begin:
            raise Invalid("%s: offsets [%d, %d] do not follow %d" % (name, begin, end, pos))
        numel = 1
        for d in shape:
            numel *= d
        if numel * DTYPES[dtype][0] >= 2**64:
            raise Invalid("%s: size overflows" % name)
        if end - begin != numel * DTYPES[dtype][0]:
            raise Invalid("%s: offsets do not match dtype and shape" % name)
        raw = data[begin:end]
        if len(raw) != end - begin:
            raise Invalid("%s: data truncated" % name)
        tensors.append({"name": name, "dtype": dtype, "shape": shape, "begin": begin, "end": end,
                        "fnv1a64": fnv1a64(raw), "values": decode(dtype, raw)})
        pos = end
    if pos != len(data):
        raise Invalid("data section is %d bytes, tensors cover %d" % (len(data), pos))
    return {"header_length": n, "metadata": metadata, "tensors": tensors}


def f32_to_bf16_bits(x):
    u = np.asarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")  # round to nearest even


def make_tensors(seed):
    """A fixed family of tensors (every dtype, scalars, empty, non-ASCII names) from a seed."""
    rng = np.random.default_rng(seed)
    out = []

    def add(name, dtype, shape, array):
        raw = np.ascontiguousarray(array, dtype=DTYPES[dtype][1]).tobytes()
        out.append((name, dtype, list(shape), raw))

    weights = (rng.standard_normal((4, 6)) * 0.02).astype("<f4")
    bf16 = f32_to_bf16_bits(weights)
    bf16.flat[:5] = [0x7FC1, 0xFF80, 0x7F80, 0x8000, 0x0001]  # NaN payload, -Inf, Inf, -0, tiny
    add("model.layers.0.self_attn.q_proj.weight", "BF16", (4, 6), bf16)
    add("model.layers.10.mlp.down_proj.weight", "BF16", (2, 3), f32_to_bf16_bits(rng.standard_normal((2, 3))))
    add("model.layers.2.mlp.down_proj.weight", "BF16", (3,), f32_to_bf16_bits(rng.standard_normal(3)))
    add("Model.Upper", "F16", (5,), rng.standard_normal(5).astype("<f2"))
    add("model.norm.weight", "F32", (6,), (1 + rng.standard_normal(6) * 0.1).astype("<f4"))
    add("r\u00e9sum\u00e9.weight", "F32", (2,), rng.standard_normal(2).astype("<f4"))
    add("scalar.f64", "F64", (), rng.standard_normal(1))
    add("empty.bf16", "BF16", (0, 3), np.zeros(0))
    for dtype, lo, hi in [("I64", -2**63, 2**63 - 1), ("U64", 0, 2**64 - 1), ("I32", -2**31, 2**31 - 1),
                          ("U32", 0, 2**32 - 1), ("I16", -2**15, 2**15 - 1), ("U16", 0, 2**16 - 1),
                          ("I8", -128, 127), ("U8", 0, 255), ("F8_E4M3", 0, 255), ("F8_E5M2", 0, 255)]:
        vals = rng.integers(lo, hi, size=7, dtype=np.uint64 if dtype == "U64" else np.int64,
                            endpoint=True)
        add("ints.%s" % dtype.lower(), dtype, (7,), vals)
    add("mask.bool", "BOOL", (2, 2), rng.integers(0, 2, size=4))
    return out


def write_reference(path, tensors, metadata=None):
    order = sorted(tensors, key=lambda t: (-RANK.index(t[1]), t[0].encode("utf-8")))
    header = {"__metadata__": dict(sorted((metadata or {"format": "pt"}).items()))}
    pos = 0
    for name, dtype, shape, raw in order:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + len(raw)]}
        pos += len(raw)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, raw in order:
            f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["read", "write"])
    parser.add_argument("file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        if args.mode == "write":
            write_reference(args.file, make_tensors(args.seed))
        description = describe(args.file)
    except Invalid as e:
        print("%s: invalid safetensors file: %s" % (args.file, e), file=sys.stderr)
        return 2
    json.dump(description, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
