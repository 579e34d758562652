#!/usr/bin/env python3
"""Independent reference of MergePipe's merge operators (SPEC §3, docs/operators.md).

Written from the specification, not from the C++ code: float64 arithmetic on the fp32 inputs,
whole-tensor numpy expressions, the TIES threshold recomputed from the magnitude-sketch
definition and the DARE mask recomputed from the documented SplitMix64 formula.

usage: operators_ref.py DIR
  DIR/input.json  n, experts, block, present[k][b], weights, densities, lambda, seed, name_key,
                  configs [{method, normalize}]
  DIR/input.bin   float32: base[n], then delta[k][n] for each expert (full tensor)
writes
  DIR/output.bin  per config: float64 ref[n], float64 scale[n], uint8 fragile[n], float64 alt[n]
  DIR/output.json {"thresholds": [fp32 bit patterns], "kept": [per-expert DARE keep counts]}

scale[i] is the sum of the magnitudes of the terms behind ref[i] (the float rounding of the
C++ fp32 sum is bounded by a small multiple of 2^-24 * scale). fragile[i] marks sign-elected
elements whose weighted sum is so close to 0 that fp32 rounding may elect the other sign; alt[i]
is then the result of the other election (else alt[i] = ref[i]).
"""
import json
import math
import sys

import numpy as np

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB


def mix_int(z):
    """SplitMix64 finaliser on a Python int (mod 2^64)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * M1) & MASK64
    z = ((z ^ (z >> 27)) * M2) & MASK64
    return z ^ (z >> 31)


def stream_key(seed, expert, name_key):
    k = mix_int(seed + GAMMA)
    k = mix_int((k ^ name_key) + GAMMA)
    return mix_int((k ^ expert) + GAMMA)


def draws(key, n):
    """Top 32 bits of the SplitMix64 outputs 0..n-1 of stream `key` (numpy, wrapping uint64)."""
    u = np.uint64
    with np.errstate(over="ignore"):
        z = u(key) + np.arange(1, n + 1, dtype=np.uint64) * u(GAMMA)
        z = (z ^ (z >> u(30))) * u(M1)
        z = (z ^ (z >> u(27))) * u(M2)
        z = z ^ (z >> u(31))
    return z >> u(32)


def keep_threshold(density_f32):
    # floor(density * 2^32); double(density_f32) * 2^32 is exact.
    return math.floor(float(density_f32) * 2.0**32)


def dare_keep(seed, expert, name_key, n, density_f32):
    key = stream_key(seed, expert, name_key)
    d = draws(key, n)
    # Cross-check the vectorised generator against plain integer arithmetic.
    for i in range(0, n, max(1, n // 257)):
        assert int(d[i]) == mix_int(key + (i + 1) * GAMMA) >> 32
    return d < np.uint64(keep_threshold(density_f32))


def sketch_threshold(delta_f32, density):
    """Lower edge of the 2^-8 relative bucket that holds the floor(density*n)-th largest |Δ|."""
    if density >= 1.0:
        return np.float32(0.0)
    n = delta_f32.size
    k = math.floor(density * n)
    if k == 0:
        return np.float32(np.inf)
    buckets = (np.abs(delta_f32).view(np.uint32) & np.uint32(0x7FFFFFFF)) >> np.uint32(15)
    kth = np.sort(buckets)[::-1][k - 1]
    return np.array([int(kth) << 15], dtype=np.uint32).view(np.float32)[0]


def main():
    folder = sys.argv[1]
    with open(f"{folder}/input.json") as f:
        meta = json.load(f)
    n, K, block = meta["n"], meta["experts"], meta["block"]
    raw = np.fromfile(f"{folder}/input.bin", dtype=np.float32)
    assert raw.size == n * (K + 1), (raw.size, n, K)
    base32 = raw[:n]
    delta32 = raw[n:].reshape(K, n)

    # The operator holds weights and densities in fp32.
    w = [float(np.float32(x)) for x in meta["weights"]]
    dens32 = [np.float32(x) for x in meta["densities"]]
    lam = float(np.float32(meta["lambda"]))
    seed = int(meta["seed"])
    name_key = int(meta["name_key"])

    # Access mask: omitted (expert, block) pairs are absent, Δ = 0.
    present = np.zeros((K, n), dtype=bool)
    for k in range(K):
        for b, p in enumerate(meta["present"][k]):
            present[k, b * block:(b + 1) * block] = bool(p)

    base = base32.astype(np.float64)
    delta = np.where(present, delta32.astype(np.float64), 0.0)

    # TIES thresholds come from the whole tensor (the catalog), read or not.
    thresholds = [sketch_threshold(delta32[k], meta["densities"][k]) for k in range(K)]
    keep = [dare_keep(seed, k, name_key, n, dens32[k]) for k in range(K)]
    dare = np.stack([np.where(keep[k], delta[k] / float(dens32[k]), 0.0) for k in range(K)])
    trimmed = np.stack([np.where(np.abs(delta32[k]) >= thresholds[k], delta[k], 0.0)
                        for k in range(K)])
    wsum = sum(w)

    outputs = []
    for cfg in meta["configs"]:
        method, normalize = cfg["method"], bool(cfg["normalize"])
        fragile = np.zeros(n, dtype=bool)
        alt = None
        if method in ("linear", "task_arithmetic", "dare_linear"):
            d = dare if method == "dare_linear" else delta
            if method == "linear":
                s = 1.0 if normalize else wsum
                alpha = [wk / wsum if normalize else wk for wk in w]
            else:
                s = 1.0
                alpha = [lam * wk / wsum if normalize else lam * wk for wk in w]
            terms = np.stack([alpha[k] * d[k] for k in range(K)])
            ref = s * base + terms.sum(axis=0)
            scale = np.abs(s * base) + np.abs(terms).sum(axis=0)
        elif method in ("ties", "dare_ties"):
            d = trimmed if method == "ties" else dare
            v = np.stack([w[k] * d[k] for k in range(K)])
            total = v.sum(axis=0)
            absum = np.abs(v).sum(axis=0)

            def elect(elected_plus):
                agree = (v != 0) & ((v > 0) == elected_plus)  # zeros never agree
                merged = np.where(agree, v, 0.0).sum(axis=0)
                divisor = np.ones(n)
                if normalize:
                    divisor = np.where(agree, np.array(w)[:, None], 0.0).sum(axis=0)
                    divisor = np.where(divisor == 0.0, 1.0, divisor)  # a zero divisor counts as 1
                return base + lam * (merged / divisor), divisor

            ref, divisor = elect(total >= 0)  # a zero sum elects +
            alt, alt_divisor = elect(total < 0)
            scale = np.abs(base) + abs(lam) * absum / np.minimum(np.abs(divisor),
                                                                  np.abs(alt_divisor))
            # A sum this close to 0 may round to the other sign in fp32 (with bf16 deltas exact
            # cancellations are common): either election is then a correct result.
            fragile = (np.abs(total) <= 1e-6 * absum) & (absum > 0)
        else:
            raise SystemExit(f"unknown method {method}")
        outputs.append((ref, scale, fragile, ref if alt is None else alt))

    with open(f"{folder}/output.bin", "wb") as f:
        for ref, scale, fragile, alt in outputs:
            f.write(ref.astype(np.float64).tobytes())
            f.write(scale.astype(np.float64).tobytes())
            f.write(fragile.astype(np.uint8).tobytes())
            f.write(np.where(fragile, alt, ref).astype(np.float64).tobytes())
    with open(f"{folder}/output.json", "w") as f:
        json.dump({
            "thresholds": [int(np.array([t], dtype=np.float32).view(np.uint32)[0])
                           for t in thresholds],
            "kept": [int(kk.sum()) for kk in keep],
        }, f)


if __name__ == "__main__":
    main()
