#!/usr/bin/env python3
"""Budget sweep of one merge config: bytes read, wall time and measured deviation from the full
read, for each budget, every run cold (inputs, catalog and the previous output evicted from the
page cache first). Standard library only. For the methods added after bench/run.py's budget
suite (issue 38: nearswap, slerp); its rows go to docs/benchmarks.md. --bound adds the full read's
I/O bound (cold storage probes) and its wall time over it.

  bench/method_sweep.py --family /tmp/vb/fam --catalog /tmp/vb/fam.catalog \\
      --config nearswap.yaml --budgets 100% 50% 25% 10% 5% --reps 2

The config is used as it is (its base_model and models name folders of the family).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import time

from run import buffered_write_seconds  # bench/run.py, beside this script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"OMPI_MCA_pml": "^cm", **os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1",
       "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def run(cmd, **kw):
    return subprocess.run(cmd, env=ENV, check=True, **kw)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", required=True)
    p.add_argument("--catalog", help="needed with --budgets")
    p.add_argument("--config", required=True)
    p.add_argument("--budgets", nargs="*", default=["100%", "50%", "25%", "10%", "5%"],
                   help="none: the full read only (slerp cannot be budgeted)")
    p.add_argument("--bound", action="store_true",
                   help="also probe the storage (cold reads of the inputs, an output-sized "
                        "write) and give the full read's wall time over its I/O bound")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--dir", default="/tmp/method-sweep", help="where the outputs go")
    p.add_argument("--mergepipe", default=os.path.join(ROOT, "build", "bin", "mergepipe"))
    p.add_argument("--reader", default=os.path.join(ROOT, "build", "bin", "read_files"))
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)

    def merge(out, budget):
        shutil.rmtree(out, ignore_errors=True)
        os.sync()
        evict = [a.family] + ([a.catalog] if a.catalog else []) + \
            [os.path.join(a.dir, d) for d in os.listdir(a.dir)]
        run([a.reader, "--evict", *[x for x in evict if os.path.exists(x)]])
        time.sleep(1)
        cmd = ["mpirun", "-np", str(a.ranks), a.mergepipe, "merge", a.config, out, "--quiet"]
        cmd += ["--full-read"] if budget is None else ["--catalog", a.catalog, "--budget", budget]
        t0 = time.monotonic()
        run(cmd)
        os.sync()  # the wall time includes getting the output to storage
        wall = time.monotonic() - t0
        with open(os.path.join(out, "mergepipe.manifest.json")) as f:
            return wall, json.load(f)

    rows = {}
    full = os.path.join(a.dir, "full")
    for rep in range(a.reps):
        for budget in [None] + a.budgets:
            out = full if budget is None else os.path.join(a.dir, "b" + budget.rstrip("%"))
            wall, m = merge(out, budget)
            label = "full read" if budget is None else budget
            row = rows.setdefault(label, {"wall": [], "manifest": m, "out": out})
            row["wall"].append(wall)
            print(f"rep {rep} {label}: {wall:.2f} s", flush=True)
    method = rows["full read"]["manifest"]["method"]
    if a.bound:
        print_bound(a, rows["full read"])
    print(f"\n| method | budget | wall s (median of {a.reps}) | expert GB read | error bound | "
          "measured ‖M − M_full‖ | rel. L2 deviation from the full read |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, row in rows.items():
        m = row["manifest"]
        expert_gb = m["bytes_read"]["expert"] / 1e9
        if label == "full read":
            deviation, measured = "0 (the reference)", "0"
        else:
            r = run([a.mergepipe, "verify", row["out"], "--against", full, "--json"],
                    capture_output=True, text=True)
            diff = json.loads(r.stdout)
            rel = diff["relative_l2"]
            deviation = "0 (bit-identical)" if rel == 0 else f"{rel:.2e}"
            measured = f"{diff['abs_l2']:.3g}"
        bound = m["error_bound"]
        print(f"| {method} | {label} | {statistics.median(row['wall']):.2f} | {expert_gb:.2f} | "
              f"{bound:.3g} | {measured} | {deviation} |")


def print_bound(a, row):
    """The full read's I/O bound: every input byte read once at the storage's cold read
    bandwidth (the faster of read_files through the cache and with O_DIRECT, 4 threads), plus
    the output written at its write bandwidth (an output-sized file written and fsynced with
    16 MiB writes). The ratio is the median wall time over it."""
    m = row["manifest"]
    plan = m["plan"]
    dirs = [plan["base_model"]] + [e["path"] for e in plan["experts"]]
    files = [os.path.join(d, n) for d in dirs for n in sorted(os.listdir(d))
             if n.endswith(".safetensors")]
    total = sum(os.path.getsize(f) for f in files)
    best = None
    for extra in ([], ["--direct"]):
        run([a.reader, "--evict", *files])
        r = run([a.reader, "--threads", "4", *extra, *files], capture_output=True, text=True)
        s = json.loads(r.stdout)["seconds"]
        best = s if best is None else min(best, s)
    out_bytes = m["bytes_read"]["output_written"]
    write_s = buffered_write_seconds(os.path.join(a.dir, "write-probe.bin"), out_bytes)
    bound = best + write_s
    wall = statistics.median(row["wall"])
    rss = m.get("peak_rss_bytes", 0) / 2**20
    print(f"\nI/O bound of the full read: {total / 1e9:.2f} GB read in {best:.2f} s "
          f"({total / best / 1e9:.2f} GB/s) + {out_bytes / 1e9:.2f} GB written in {write_s:.2f} s "
          f"= {bound:.2f} s; full read {wall:.2f} s = {wall / bound:.2f} x the bound; "
          f"peak RSS {rss:.0f} MiB per rank")


if __name__ == "__main__":
    main()
