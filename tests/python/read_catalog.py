#!/usr/bin/env python3
"""Prints what h5py sees in a mergepipe catalog: root attributes, every dataset with its shape and
dtype, the tensor table, and per-expert totals (used by tests/unit/catalog_test.cpp)."""
import json
import sys

import h5py
import numpy as np


def main(folder):
    with open(folder + "/catalog.json") as f:
        summary = json.load(f)
    with h5py.File(folder + "/catalog.h5", "r") as h5:
        for key in sorted(h5.attrs):
            value = h5.attrs[key]
            if isinstance(value, bytes):
                value = value.decode()
            elif isinstance(value, np.ndarray) and value.dtype.kind == "S":
                value = value.item().decode()
            print(f"@{key} {value}")

        def show(name, obj):
            if isinstance(obj, h5py.Dataset):
                print(f"/{name} {obj.shape} {obj.dtype.str if obj.dtype.kind == 'S' else obj.dtype}")

        h5.visititems(show)
        names = [n.decode() for n in h5["tensors/name"][...]]
        dtypes = [d.decode() for d in h5["tensors/dtype"][...]]
        ndim = h5["tensors/ndim"][...]
        dims = h5["tensors/dims"][...]
        pos = 0
        for i, (name, dtype) in enumerate(zip(names, dtypes)):
            shape = [int(d) for d in dims[pos:pos + ndim[i]]]
            pos += ndim[i]
            print(f"tensor {i} {name} {dtype} [{', '.join(map(str, shape))}]")
        for k, expert in enumerate(summary["experts"]):
            g = h5[expert["group"]]
            nonzero = int(g["block_nonzero"][...].sum())
            sketch_total = int(g["sketch_counts"][...].sum())
            l2_0 = float(g["block_l2"][0]) if g["block_l2"].shape[0] else 0.0
            print(f"expert {k} nonzero {nonzero} sketch_total {sketch_total} l2_0 {l2_0:g}")


if __name__ == "__main__":
    main(sys.argv[1])
