#!/usr/bin/env python3
"""Independent numpy reference of MergePipe's operators (SPEC section 3) on whole folders.

usage: merge_ref.py CONFIG.yaml MERGED_DIR [--dare-check]
Reads the config (merge_method, base_model, models, parameters) with PyYAML, the base and expert
safetensors with its own parser, computes the full-read merge in fp32 and compares it with the
folder MergePipe wrote. Linear, task arithmetic and TIES are compared value by value (TIES with
the documented threshold: lower edge of the 2^-8 magnitude bucket holding the k-th largest
|delta|); DARE is checked statistically (kept fraction ~ density, kept values = delta/density).
Exits non-zero with a message on any mismatch.
"""
import json
import math
import os
import re
import struct
import sys

import numpy as np
import yaml


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        buf = raw[8 + n + b:8 + n + e]
        dt = meta["dtype"]
        if dt == "BF16":
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            arr = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif dt == "F32":
            arr = np.frombuffer(buf, dtype="<f4").copy()
        else:
            raise SystemExit(f"{path}: unsupported dtype {dt}")
        out[name] = (arr.reshape(meta["shape"]) if meta["shape"] else arr.reshape(()), dt)
    return out


def read_folder(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(os.path.join(folder, f)))
    return tensors


def sketch_threshold(delta, density):
    """Lower edge of the 2^-8 bucket holding the k-th largest |delta| (k = floor(density n))."""
    if density >= 1.0:
        return np.float32(0.0)
    flat = np.abs(delta.ravel()).astype(np.float32)
    k = int(math.floor(density * flat.size))
    if k == 0:
        return np.float32(np.inf)
    buckets = (flat.view(np.uint32) & np.uint32(0x7FFFFFFF)) >> np.uint32(15)
    kth = np.sort(buckets)[::-1][k - 1]
    return np.array([np.uint32(kth) << np.uint32(15)], dtype=np.uint32).view(np.float32)[0]


def breadcrumbs_mask(delta, density, gamma):
    """mergekit's magnitude_outliers on 2^-8 buckets: drop the top int(gamma n) and keep the next
    int(density n) by |delta| (a negative bottom count is taken from the top; a top of 0 keeps
    nothing), keeping whole buckets at both cuts."""
    flat = np.abs(delta.ravel()).astype(np.float32)
    n = flat.size
    if density >= 1.0:
        return np.ones(delta.shape, dtype=bool)
    keep, top = int(math.floor(density * n)), int(math.floor(gamma * n))
    if n - keep - top < 0:
        top = n - keep
    if keep == 0 or top == 0:
        return np.zeros(delta.shape, dtype=bool)
    buckets = (flat.view(np.uint32) & np.uint32(0x7FFFFFFF)) >> np.uint32(15)
    desc = np.sort(buckets)[::-1]
    upper, lower = int(desc[top]), int(desc[top + keep - 1])  # the largest and smallest kept
    inside = buckets >= lower
    if upper < 0xFF00:  # an upper bucket of Inf or NaN cuts nothing
        inside &= buckets <= upper
    return inside.reshape(delta.shape)


def evaluate(setting, name, t):
    """mergekit's parameter lookup for one tensor at position t (None: no conditional matched)."""
    if isinstance(setting, (bool, int, float)):
        return float(setting)
    if isinstance(setting, dict):
        setting = [setting]
    if all(isinstance(v, (int, float)) for v in setting):
        x = t * (len(setting) - 1)
        lo = int(x)
        hi = min(len(setting) - 1, lo + 1)
        return (1 - (x - lo)) * setting[lo] + (x - lo) * setting[hi]
    for cond in setting:
        f = cond.get("filter")
        if f is None or f == "*" or f in name:
            return evaluate(cond["value"], name, t)
    return None


def positions(names):
    """t per tensor: layer i of n at i/(n-1) (1 if n == 1); tensors outside the layers at 0."""
    layer = {n: int(m.group(1)) for n in names if (m := re.search(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.", n))}
    count = max(layer.values(), default=-1) + 1
    out = {}
    for n in names:
        if n in layer:
            out[n] = layer[n] / (count - 1) if count > 1 else 1.0
        else:
            out[n] = 0.0
    return out


def lookup(model_params, top, key, name, t, default):
    for level in (model_params or {}, top):
        if key in level:
            v = evaluate(level[key], name, t)
            if v is not None:
                return v
    return default


def karcher_mean(points, max_iter, tol):
    """mergekit's karcher on whole vectors (float64): equal weights, Riemannian steps."""
    alphas = [1.0 / len(points)] * len(points)
    norms = [float(np.linalg.norm(p)) for p in points]
    units = [p / n if n > 0 else np.zeros_like(p) for p, n in zip(points, norms)]
    valid = [i for i, n in enumerate(norms) if n > tol]
    if not valid:
        return np.zeros_like(points[0])
    va = [alphas[i] / sum(alphas[i] for i in valid) for i in valid]
    vu = [units[i] for i in valid]
    mean = sum(a * u for a, u in zip(va, vu))
    mn = float(np.linalg.norm(mean))
    mean = vu[0].copy() if mn < tol else mean / mn
    for _ in range(max_iter):
        tangent = np.zeros_like(mean)
        for a, u in zip(va, vu):
            dot = min(1.0, max(-1.0, float(np.dot(mean, u))))
            theta = math.acos(dot)
            if theta < tol:
                continue
            tangent += a * (theta / math.sin(theta)) * (u - dot * mean)
        tn = float(np.linalg.norm(tangent))
        if tn < tol:
            break
        mean = math.cos(tn) * mean + math.sin(tn) * (tangent / tn)
        un = float(np.linalg.norm(mean))
        if un > tol:
            mean = mean / un
    return sum(a * n for a, n in zip(alphas, norms)) * mean


def multislerp_of(vectors, weights, normalize, eps):
    """mergekit's multislerp on whole vectors (float64)."""
    if len(vectors) == 1:
        return vectors[0]
    w = np.array(weights, dtype=np.float64)
    if normalize:
        w = w / w.sum()
    norms = np.array([np.linalg.norm(v) for v in vectors])
    if not norms.any():  # no expert changed the tensor: MergePipe keeps the base (mergekit raises)
        return np.zeros_like(vectors[0])
    units = [v / (n + eps) for v, n in zip(vectors, norms)]
    mean = sum(wi * u for wi, u in zip(w, units))
    mn = float(np.linalg.norm(mean))
    if mn < eps:
        assert len(vectors) == 2, "multislerp: the weighted unit mean vanishes"
        return w[0] * vectors[0] + w[1] * vectors[1]
    mean = mean / mn
    tangent = sum(wi * (u - float(np.dot(u, mean)) * mean) for wi, u in zip(w, units))
    tn = float(np.linalg.norm(tangent)) + eps
    return (mean * math.cos(tn) + tangent * (math.sin(tn) / tn)) * float((norms * w).sum())


def nuslerp_of(t, v0, v1):
    """mergekit's nuslerp of two whole vectors (float64): norms clamped at 1e-7, lerp when
    |sin theta| < 1e-8."""
    u0 = v0 / max(float(np.linalg.norm(v0)), 1e-7)
    u1 = v1 / max(float(np.linalg.norm(v1)), 1e-7)
    theta = math.acos(min(1.0, max(-1.0, float(np.dot(u0, u1)))))
    s = math.sin(theta)
    if abs(s) < 1e-8:
        return (1 - t) * v0 + t * v1
    return (math.sin((1 - t) * theta) * v0 + math.sin(t * theta) * v1) / s


def main():
    config_path, merged_dir = sys.argv[1], sys.argv[2]
    cfg = yaml.safe_load(open(config_path))
    here = os.path.dirname(os.path.abspath(config_path))

    def resolve(p):
        """A folder (current directory first, as mergekit), else a hub id in the local HF cache."""
        for candidate in (p, os.path.join(here, p)):
            if os.path.isdir(candidate):
                return os.path.abspath(candidate)
        cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
            os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")
        repo = os.path.join(cache, "models--" + p.replace("/", "--"))
        commit = open(os.path.join(repo, "refs", "main")).read().strip()
        return os.path.join(repo, "snapshots", commit)
    method = cfg["merge_method"]
    params = cfg.get("parameters", {}) or {}
    normalize = params.get("normalize", method in ("linear", "ties"))
    band = method in ("breadcrumbs", "breadcrumbs_ties")
    if "slices" in cfg:
        # One slice of every layer (mergekit's slerp examples): its sources are the models.
        assert len(cfg["slices"]) == 1, "the reference takes one whole-model slice"
        models = [{k: v for k, v in src.items() if k != "layer_range"} for src in cfg["slices"][0]["sources"]]
    else:
        models = [m if isinstance(m, dict) else {"model": m} for m in cfg["models"]]
    # linear without base_model (mergekit allows it): the plain weighted average of the models.
    average_only = "base_model" not in cfg
    base = read_folder(resolve(cfg["base_model"] if not average_only else models[0]["model"]))
    if not average_only and method != "linear":  # the base among the models: a zero delta
        models = [m for m in models if resolve(m["model"]) != resolve(cfg["base_model"])]
    experts = [read_folder(resolve(m["model"])) for m in models]
    merged = read_folder(merged_dir)
    where = positions(list(base))
    worst = rel_l2 = 0.0
    for name, (theta0, _) in base.items():
        t_pos = where[name]
        weights = [lookup(m.get("parameters"), params, "weight", name, t_pos, 1.0) for m in models]
        densities = [lookup(m.get("parameters"), params, "density", name, t_pos, 1.0) for m in models]
        gammas = [lookup(m.get("parameters"), params, "gamma", name, t_pos, 0.01) for m in models]
        lam = np.float32(lookup(None, params, "lambda", name, t_pos, 1.0))
        wsum = sum(weights)
        got, out_dtype = merged[name]
        deltas = [e[name][0] - theta0 for e in experts]  # fp32 subtraction, as MergePipe
        if method == "linear" and average_only:
            total = sum(np.float64(w) * e[name][0].astype(np.float64) for w, e in zip(weights, experts))
            ref = total / np.float64(wsum) if normalize else total
        elif method == "linear":
            alpha = [np.float32(w / wsum) if normalize else np.float32(w) for w in weights]
            acc = np.zeros_like(theta0)
            for a, d in zip(alpha, deltas):
                acc = acc + a * d
            ref = np.float32(1.0 if normalize else wsum) * theta0 + acc
        elif method == "task_arithmetic":
            alpha = [np.float32(lam * w / wsum) if normalize else np.float32(lam * w) for w in weights]
            acc = np.zeros_like(theta0)
            for a, d in zip(alpha, deltas):
                acc = acc + a * d
            ref = theta0 + acc
        elif method == "breadcrumbs":
            # mergekit's generalized task arithmetic without a sign election: the trimmed deltas'
            # weighted sum (divided by the weights' sum when normalized), times lambda.
            alpha = [np.float32(lam * w / wsum) if normalize else np.float32(lam * w) for w in weights]
            acc = np.zeros_like(theta0)
            for a, d, dens, g in zip(alpha, deltas, densities, gammas):
                acc = acc + a * np.where(breadcrumbs_mask(d, dens, g), d, np.float32(0))
            ref = theta0 + acc
        elif method == "ram":
            # mergekit's ram: per entry, the mean of the deltas larger than epsilon (in
            # magnitude); an entry no expert moves by more stays the base's.
            eps = np.float32(params.get("epsilon", 1e-5))
            total, count = np.zeros_like(theta0), np.zeros_like(theta0)
            for d in deltas:
                active = np.abs(d) > eps
                total = total + np.where(active, d, np.float32(0))
                count = count + active.astype(np.float32)
            ref = theta0 + total / np.maximum(count, np.float32(1))
        elif method in ("ties", "breadcrumbs_ties"):
            if band:
                trimmed = [np.where(breadcrumbs_mask(d, dens, g), d, np.float32(0)) for d, dens, g in zip(deltas, densities, gammas)]
            else:
                trimmed = [np.where(np.abs(d) >= sketch_threshold(d, dens), d, np.float32(0)) for d, dens in zip(deltas, densities)]
            v = [np.float32(w) * t for w, t in zip(weights, trimmed)]
            # The elected sign is that of the sum evaluated as P + N, the positive and the
            # negative terms each added in expert order (docs/operators.md, TIES step 4): near
            # an exact cancellation another order can round to the other sign.
            pos, neg = np.zeros_like(theta0), np.zeros_like(theta0)
            for x in v:
                pos = pos + np.where(x > 0, x, np.float32(0))
                neg = neg + np.where(x < 0, x, np.float32(0))
            total = pos + neg
            sign = np.where(total >= 0, np.float32(1), np.float32(-1))
            merged_sum = np.zeros_like(theta0)
            divisor = np.zeros_like(theta0)
            for w, x in zip(weights, v):
                agree = (x != 0) & (np.sign(x) == sign)
                merged_sum = merged_sum + np.where(agree, x, np.float32(0))
                divisor = divisor + np.where(agree, np.float32(w), np.float32(0))
            if normalize:
                merged_sum = merged_sum / np.where(divisor == 0, np.float32(1), divisor)
            ref = theta0 + lam * merged_sum
        elif method == "nearswap":
            # mergekit's form: w = clamp(t / max(|base - other|, 1e-6), 0, 1), w*other + (1-w)*base
            other = experts[0][name][0]
            t = np.float32(lookup(None, params, "t", name, t_pos, None))
            w = np.clip(t / np.maximum(np.abs(theta0 - other), np.float32(1e-6)), 0, 1).astype(np.float32)
            ref = w * other + (np.float32(1) - w) * theta0
        elif method == "slerp":
            # mergekit's slerp on the flattened tensors, in float64: each normalised unless its
            # norm is <= 1e-8, lerp when |cos| > 0.9995, else s0*base + s1*other.
            other = experts[0][name][0]
            t = float(lookup(None, params, "t", name, t_pos, None))
            a, b = theta0.astype(np.float64), other.astype(np.float64)
            na, nb = np.linalg.norm(a), np.linalg.norm(b)
            cos = float(np.sum((a / na if na > 1e-8 else a) * (b / nb if nb > 1e-8 else b)))
            if abs(cos) > 0.9995:
                s0, s1 = 1.0 - t, t
            else:
                omega = math.acos(cos)
                s0, s1 = math.sin((1 - t) * omega) / math.sin(omega), math.sin(t * omega) / math.sin(omega)
            ref = s0 * a + s1 * b
            terms = np.abs(s0 * a) + np.abs(s1 * b)  # fp32 rounding scales with these
        elif method == "model_stock":
            # Mean pairwise cosine of the deltas, t = N cos / (1 + (N-1) cos), t*avg + (1-t)*base.
            offs = [d.astype(np.float64).ravel() for d in deltas]
            cos = []
            for i in range(len(offs)):
                for j in range(i + 1, len(offs)):
                    prod = max(float(np.linalg.norm(offs[i]) * np.linalg.norm(offs[j])), 1e-6)
                    cos.append(min(1.0, max(-1.0, float(np.dot(offs[i], offs[j])) / prod)))
            c, n_ft = sum(cos) / len(cos), len(offs)
            t = n_ft * c / (1 + (n_ft - 1) * c)
            avg = sum(e[name][0].astype(np.float64) for e in experts) / n_ft
            ref = t * avg + (1 - t) * theta0.astype(np.float64)
            terms = np.abs(theta0) + sum(np.abs(t / n_ft * d) for d in deltas)
        elif method == "nuslerp":
            wsum_ab = weights[0] + weights[1]
            t = 0.5 if abs(wsum_ab) < 1e-6 else weights[1] / wsum_ab
            shape = theta0.shape
            if average_only:  # the two models themselves
                a, b = (e[name][0].astype(np.float64).ravel() for e in experts)
                ref = nuslerp_of(t, a, b).reshape(shape)
            else:
                a, b = (d.astype(np.float64).ravel() for d in deltas)
                ref = theta0.astype(np.float64) + nuslerp_of(t, a, b).reshape(shape)
            terms = np.abs(theta0) + np.abs(ref) + sum(np.abs(d) for d in deltas)
        elif method in ("karcher", "multislerp"):
            if average_only:
                points = [e[name][0].astype(np.float64) for e in experts]  # every model, the first too
            else:
                points = [theta0.astype(np.float64)] + [e[name][0].astype(np.float64) for e in experts]
            shape = theta0.shape
            if method == "karcher":
                ref = karcher_mean([p.ravel() for p in points], int(params.get("max_iter", 10)),
                                   float(params.get("tol", 1e-5))).reshape(shape)
            else:
                eps = float(params.get("eps", 1e-8))
                norm_w = params.get("normalize_weights", True)
                if average_only:
                    ref = multislerp_of([p.ravel() for p in points], weights, norm_w, eps).reshape(shape)
                else:
                    vecs = [d.astype(np.float64).ravel() for d in deltas]
                    ref = theta0.astype(np.float64) + multislerp_of(vecs, weights, norm_w, eps).reshape(shape)
            terms = np.abs(theta0) + np.abs(ref) + sum(np.abs(d) for d in deltas)
        else:
            ref = None
        if ref is None:
            continue
        ref = ref.astype(np.float32)
        if out_dtype == "BF16":
            tol = np.abs(ref) * 2.0 ** -8 + 1e-30  # one bf16 rounding
        elif out_dtype == "F16":
            tol = np.abs(ref) * 2.0 ** -11 + 2.0 ** -25  # one fp16 rounding (subnormals too)
        else:
            tol = np.abs(ref) * 2e-6 + 1e-9 * max(1.0, float(np.abs(theta0).max(initial=0)))
        if method in ("slerp", "model_stock", "karcher", "multislerp", "nuslerp"):
            tol = tol + terms * 2.0 ** -21  # (s0 + s1)*base + s1*delta in fp32: a few ulps of the terms
        err = np.abs(got.astype(np.float32) - ref)
        if np.any(err > tol):
            i = int(np.argmax(err - tol))
            raise SystemExit(f"{method}: tensor {name} differs at flat index {i}: got {got.ravel()[i]!r}, reference {ref.ravel()[i]!r}")
        worst = max(worst, float((err / np.maximum(np.abs(ref), 1e-30)).max(initial=0)))
        ref_norm = float(np.linalg.norm(ref.astype(np.float64)))
        if ref_norm > 0:
            rel_l2 = max(rel_l2, float(np.linalg.norm(err.astype(np.float64))) / ref_norm)
    if method.startswith("dare"):
        # One-expert DARE: out - base is 0 or lambda*w*delta/density (delta without rescale).
        assert len(experts) == 1, "the DARE check needs a single expert"
        kept_total = changed = 0
        for name, (theta0, _) in base.items():
            got = merged[name][0].astype(np.float32)
            d = experts[0][name][0] - theta0
            nz = d != 0
            if not nz.any():
                continue
            moved = (got - theta0)[nz]
            scale = np.float32(densities[0]) if params.get("rescale", True) else np.float32(1)
            expect = (lam * np.float32(weights[0]) * d[nz] / scale).astype(np.float32)
            kept = np.abs(moved) > 0
            kept_total += int(kept.sum())
            changed += int(nz.sum())
            rel = np.abs(moved[kept] - expect[kept]) / np.abs(expect[kept])
            assert rel.size == 0 or rel.max() < 1e-5, (name, float(rel.max()))
        frac = kept_total / changed
        sigma = math.sqrt(densities[0] * (1 - densities[0]) / changed)
        print(f"dare: kept fraction {frac:.4f} of {changed} non-zero deltas, density {densities[0]} (sigma {sigma:.4f})")
        assert abs(frac - densities[0]) < 5 * sigma + 1e-3, (frac, densities[0])
    geometric = ("slerp", "model_stock", "karcher", "multislerp", "nuslerp")
    if method in geometric and all(merged[n][1] == "F32" for n in base):
        assert rel_l2 <= 1e-6, f"{method}: relative L2 {rel_l2:.3g} above 1e-6"
    print(f"{method}: matches the numpy reference (worst relative error {worst:.3g}, "
          f"worst tensor relative L2 {rel_l2:.3g})")


if __name__ == "__main__":
    main()
