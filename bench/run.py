#!/usr/bin/env python3
"""MergePipe benchmark driver (issue 5). Standard library only; plots with gnuplot.

Every merge runs cold: the family's files (and the previous output) are evicted from the page
cache first. Each group of merges sits next to a plain read of the same input files (`cat`, and
bench/read_files with 4 threads, through the page cache and with O_DIRECT; the fastest is the
storage read bandwidth of that moment) and a write of an output-sized file (buffered + fsync, and
O_DIRECT; the faster is the write bandwidth), because this machine's disk speed drifts: every
ratio reported comes from measurements taken side by side.

  bench/run.py --suite all                 # everything below (35 min on 2 cores, 50 GB in --dir)
  bench/run.py --suite headline --reps 3   # K=20 TIES: full read vs 10% budget
  bench/run.py --quick                     # a small family, one repetition (a smoke run)
  bench/run.py --report docs/bench/suite-all.csv --plots docs/bench   # tables and plots again
  bench/run.py --suite warm --reps 5 --page-reporting off --damon off   # a VM's memory features
                                                                         # off for the run (root)

Suites: headline, k (expert I/O and wall time vs K), budget (wall time and deviation vs budget,
for linear, ties and dare_ties), ranks (1 and 2 ranks, threads), warm (compute-bound throughput
at 1 and 2 ranks, output on tmpfs), rss (peak RSS per rank for two presets), device (whether
the disk reads and writes at once or in turn, which the bound assumes).
Output: one CSV row per run (--csv), a summary printed as markdown, and PNG plots (--plots).
"""
import argparse
import csv
import glob
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import vm_settings
from vm_settings import DamonReclaim, PageReporting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# OMPI_MCA_pml: skip the cm PML, whose PSM transports wait ~0.2 s at start-up on a machine
# without their hardware (docs/cluster.md); a value set by the caller wins.
ENV = {"OMPI_MCA_pml": "^cm", **os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1",
       "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}
def binding(threads):
    """mpirun options for a rank with `threads` compute threads: Open MPI binds each rank to one
    core when it starts two or fewer, which would put a multi-threaded rank's threads on one core.
    Single-threaded ranks keep that default binding (one core per rank)."""
    return ["--bind-to", "none"] if threads > 1 else []


FIELDS = ["suite", "preset", "experts", "method", "config", "budget", "ranks", "threads", "rep",
          "wall_s", "expert_bytes", "base_bytes", "output_bytes", "bytes_moved", "read_bw",
          "write_bw", "bound_s", "ratio", "speedup_vs_full", "full_wall_s", "read_once_s",
          "peak_rss_bytes", "plan_s", "merge_s", "kernel_read_bytes", "deviation_rel_l2",
          "throughput_bps", "catalog_s", "program_s", "full_bound_s", "page_reporting",
          "damon"]

def log(*a):
    print(*a, file=sys.stderr, flush=True)


def buffered_write_seconds(path, nbytes):
    """Seconds to write a new file of `nbytes` through the page cache in 16 MiB writes and
    fsync it (the file is removed after)."""
    block = b"\x5a" * (16 << 20)
    t0 = time.monotonic()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.monotonic() - t0
    os.remove(path)
    return seconds


def tree_bytes(path):
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)


class Bench:
    def __init__(self, args, rows=None):
        self.a = args
        self.catalogs = {}  # family name -> sizes and build time of its catalog
        if rows is not None:  # re-rendering a saved run: no build, no merges
            self.rows = rows
            return
        self.mp = os.path.join(args.build, "bin", "mergepipe")
        self.reader = os.path.join(args.build, "bin", "read_files")
        for exe in (self.mp, self.reader):
            if not os.access(exe, os.X_OK):
                sys.exit(f"run.py: {exe} missing: build first (scripts/build.sh release)")
        os.makedirs(args.dir, exist_ok=True)
        self.rows = []
        self.csv_file = open(args.csv, "w", newline="")
        self.csv = csv.DictWriter(self.csv_file, FIELDS)
        self.csv.writeheader()

    # ---- helpers ---------------------------------------------------------------------------
    def run(self, cmd, **kw):
        return subprocess.run(cmd, env=ENV, check=True, **kw)

    def evict(self, *paths):
        existing = [p for p in paths if os.path.exists(p)]
        if existing:
            self.run([self.reader, "--evict", *existing])

    def family(self, preset, experts, extra=()):
        name = f"fam-{preset}-{experts}" + "".join(x.replace("-", "") for x in extra)
        fam = os.path.join(self.a.dir, name)
        if not os.path.exists(os.path.join(fam, "family.json")):
            log(f"== synth {name}")
            self.run([self.mp, "synth", "--preset", preset, "--experts", str(experts), "--seed", "1",
                      "--out", fam, "--force", *extra], stdout=subprocess.DEVNULL)
        cat = fam + ".catalog"
        if not os.path.exists(os.path.join(cat, "catalog.json")):
            self.evict(fam)
            log(f"== catalog {name}")
            t0 = time.monotonic()
            self.run(["mpirun", "-np", "2", self.mp, "catalog", "--base", f"{fam}/base",
                      "--experts", *self.experts(fam, experts), "--out", cat, "--quiet"])
            meta = {"catalog_build_s": time.monotonic() - t0}
            with open(cat + ".bench.json", "w") as f:
                json.dump(meta, f)
        if name not in self.catalogs:
            with open(cat + ".bench.json") as f:
                build_s = json.load(f)["catalog_build_s"]
            self.catalogs[name] = dict(experts=experts, family_bytes=tree_bytes(fam),
                                       catalog_bytes=tree_bytes(cat), build_s=build_s)
        return fam, cat

    @staticmethod
    def experts(fam, k):
        return [f"{fam}/expert{i:02d}" for i in range(k)]

    def config(self, fam, k, method):
        path = os.path.join(self.a.dir, f"{os.path.basename(fam)}-{method}-k{k}.yaml")
        with open(path, "w") as f:
            f.write(f"merge_method: {method}\nbase_model: {fam}/base\nmodels:\n")
            for e in self.experts(fam, k):
                f.write(f"  - {{model: {e}, parameters: {{weight: 1.0, density: 0.5}}}}\n")
            f.write("seed: 0\n")
        return path

    def input_files(self, fam, k):
        files = []
        for d in [f"{fam}/base"] + self.experts(fam, k):
            files += sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".safetensors"))
        return files

    def read_bandwidth(self, files):
        """Cold read of `files` once: with cat, with read_files on 4 threads through the page cache,
        and on 4 threads with O_DIRECT into huge pages (how a merge reads uncached files). The
        fastest is the storage read bandwidth of this moment: on the test VM, reads through the
        page cache ran at a fraction of the direct ones (1.1 against 5.1 GB/s for the K = 20
        family), so a bound taken from them alone would flatter every merge that reads direct."""
        total = sum(os.path.getsize(f) for f in files)
        self.evict(*files)
        t0 = time.monotonic()
        with open(os.devnull, "wb") as null:
            self.run(["cat", *files], stdout=null)
        cat_s = time.monotonic() - t0
        timings = {"cat": cat_s}
        for name, extra in (("4 threads", []), ("4 threads direct", ["--direct"])):
            self.evict(*files)
            out = self.run([self.reader, "--threads", "4", *extra, *files], capture_output=True,
                           text=True)
            timings[name] = json.loads(out.stdout)["seconds"]
        best = min(timings.values())
        log(f"   read {total / 1e9:.2f} GB: " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
        return total / best, best

    def write_bandwidth(self, nbytes):
        """Writes and fsyncs an output-sized file twice: through the page cache in 16 MiB writes,
        and with O_DIRECT in 16 MiB writes from 2 threads (how the merges write their shards).
        The faster is the storage write bandwidth of this moment."""
        buffered_s = buffered_write_seconds(os.path.join(self.a.dir, "write-probe.bin"), nbytes)
        direct_bytes, direct_s = self.direct_write(nbytes)
        log(f"   write {nbytes / 1e9:.2f} GB: buffered+fsync {nbytes / buffered_s / 1e9:.2f} GB/s, "
            f"direct {direct_bytes / direct_s / 1e9:.2f} GB/s")
        return max(nbytes / buffered_s, direct_bytes / direct_s)

    def direct_write(self, nbytes, name="write-probe.bin"):
        """Writes a new file of about `nbytes` with O_DIRECT in 16 MiB writes from 2 threads and
        fsyncs it (how the merges write their shards); returns (bytes, seconds)."""
        path = os.path.join(self.a.dir, name)
        step = 16 << 20
        block = b"\x5a" * step
        chunks = (nbytes + step - 1) // step
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        try:
            def writer(first):
                buf = mmap.mmap(-1, step)  # page-aligned, as O_DIRECT needs
                buf.write(block)
                for c in range(first, chunks, 2):
                    os.pwrite(fd, buf, c * step)
            t0 = time.monotonic()
            threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            os.fsync(fd)
            seconds = time.monotonic() - t0
        finally:
            os.close(fd)
            os.remove(path)
        return chunks * step, seconds

    def direct_read(self, files):
        """Seconds to read `files` (evicted first) with O_DIRECT on 4 threads."""
        self.evict(*files)
        out = self.run([self.reader, "--threads", "4", "--direct", *files], capture_output=True,
                       text=True)
        return json.loads(out.stdout)["seconds"]

    def merge(self, fam, cat, cfg, out, budget=None, ranks=2, threads=0, extra=()):
        shutil.rmtree(out, ignore_errors=True)
        # Start from a quiet device: earlier outputs and probes flushed, nothing cached.
        os.sync()
        self.evict(fam, cat, *glob.glob(os.path.join(self.a.dir, "out*")))
        time.sleep(1)
        cmd = ["mpirun", "-np", str(ranks), *binding(threads), self.mp, "merge", cfg, "--out",
               out, "--quiet", "--threads", str(threads), *extra]
        cmd += ["--full-read"] if budget is None else ["--catalog", cat, "--budget", budget]
        t0 = time.monotonic()
        self.run(cmd)
        os.sync()  # the wall time includes getting every output byte to storage
        wall = time.monotonic() - t0
        with open(os.path.join(out, "mergepipe.manifest.json")) as f:
            m = json.load(f)
        return wall, m

    def deviation(self, out, reference):
        r = self.run([self.mp, "verify", out, "--against", reference, "--json"], capture_output=True,
                     text=True)
        return json.loads(r.stdout)["relative_l2"]

    def record(self, **row):
        row.setdefault("page_reporting", PageReporting.state())
        row.setdefault("damon", DamonReclaim.state())
        self.rows.append(row)
        self.csv.writerow({k: row.get(k, "") for k in FIELDS})
        self.csv_file.flush()

    def row_from(self, suite, preset, k, method, config, budget, ranks, threads, rep, wall, m,
                 read_bw, write_bw, input_bytes, **extra):
        b = m["bytes_read"]
        # What the run must move: for a full read every input byte once (a full-read TIES reads
        # its largest tensors twice, for the threshold scan and for the merge), else what it read.
        reads = input_bytes if budget is None else b["base"] + b["expert"]
        moved = reads + b["output_written"]
        # Reads at the read bandwidth, the output at the write bandwidth (fsync included).
        bound = reads / read_bw + b["output_written"] / write_bw
        row = dict(suite=suite, preset=preset, experts=k, method=method, config=config,
                   budget=budget or "full-read", ranks=ranks, threads=m["threads"], rep=rep,
                   wall_s=round(wall, 3), expert_bytes=b["expert"], base_bytes=b["base"],
                   output_bytes=b["output_written"], bytes_moved=moved, read_bw=round(read_bw),
                   write_bw=round(write_bw), bound_s=round(bound, 3), ratio=round(wall / bound, 3),
                   peak_rss_bytes=m["peak_rss_bytes"], plan_s=m["timings"]["plan"],
                   merge_s=m["timings"]["merge"], catalog_s=m["timings"].get("catalog_load", 0),
                   program_s=m["timings"]["total"],
                   kernel_read_bytes=m.get("kernel_io", {}).get("read_bytes", ""),
                   throughput_bps=round(moved / wall))
        row.update(extra)
        return row

    # ---- one group: reference reads, full read, budgeted merges, side by side -----------------
    def group(self, suite, preset, k, method, budgets, rep, ranks=2, threads=0, deviation=False,
              family_extra=()):
        fam, cat = self.family(preset, max(k, self.a.family_experts if preset == self.a.preset else k),
                               family_extra)
        cfg = self.config(fam, k, method)
        files = self.input_files(fam, k)
        read_bw, read_once = self.read_bandwidth(files)
        input_bytes = sum(os.path.getsize(f) for f in files)
        # One output folder per run, all removed at the end of the group: deleting the previous
        # run's 1.5 GB output right before a run made that run slower (ext4 freeing extents).
        full_out = os.path.join(self.a.dir, "out-full")
        log(f"== {suite}: {preset} K={k} {method} ranks={ranks} rep={rep}")
        wall_full, m_full = self.merge(fam, cat, cfg, full_out, None, ranks, threads)
        write_bw = self.write_bandwidth(m_full["bytes_read"]["output_written"])
        row_full = self.row_from(suite, preset, k, method, "full-read", None, ranks, threads, rep,
                                 wall_full, m_full, read_bw, write_bw, input_bytes,
                                 full_wall_s=round(wall_full, 3), read_once_s=round(read_once, 3),
                                 speedup_vs_full=1.0, deviation_rel_l2=0.0)
        row_full["full_bound_s"] = row_full["bound_s"]
        self.record(**row_full)
        log(f"   full-read {wall_full:.2f} s ratio {row_full['ratio']:.2f}")
        outs = [full_out]
        for budget in budgets:
            out_dir = os.path.join(self.a.dir, "out-" + budget.rstrip("%"))
            outs.append(out_dir)
            wall, m = self.merge(fam, cat, cfg, out_dir, budget, ranks, threads)
            dev = self.deviation(out_dir, full_out) if deviation else ""
            row = self.row_from(suite, preset, k, method, f"budget {budget}", budget, ranks, threads,
                                rep, wall, m, read_bw, write_bw, input_bytes, full_wall_s=round(wall_full, 3),
                                full_bound_s=row_full["bound_s"], read_once_s=round(read_once, 3),
                                speedup_vs_full=round(wall_full / wall, 3), deviation_rel_l2=dev)
            self.record(**row)
            log(f"   budget {budget}: {wall:.2f} s ratio {row['ratio']:.2f} "
                f"speedup {row['speedup_vs_full']:.2f}x")
        for out in outs:
            shutil.rmtree(out, ignore_errors=True)

    # ---- suites ------------------------------------------------------------------------------
    def suite_headline(self):
        for rep in range(self.a.reps):
            self.group("headline", self.a.preset, self.a.family_experts, "ties", ["10%"], rep)

    def suite_k(self):
        for rep in range(self.a.reps):
            for k in self.a.k_values:
                for method in ("linear", "ties"):
                    self.group("k", self.a.preset, k, method, ["10%"], rep)

    def suite_budget(self):
        for rep in range(self.a.reps):
            for method in ("linear", "ties", "dare_ties"):
                self.group("budget", self.a.preset, self.a.family_experts, method,
                           ["100%", "50%", "25%", "10%", "5%"], rep, deviation=True)

    def suite_ranks(self):
        for rep in range(self.a.reps):
            for ranks, threads in ((1, 1), (1, 2), (2, 1)):
                self.group("ranks", self.a.preset, self.a.family_experts, "ties", ["10%"], rep,
                           ranks=ranks, threads=threads)

    def suite_warm(self):
        """Compute-bound throughput: inputs in the page cache, output on tmpfs. The first
        --warm-experts experts of the main family (K = 8: 13.5 GB of inputs, merges of 1-3 s;
        the 8-layer family used before gave merges of 0.7-1.3 s, where fixed costs and noise
        moved the 2-vs-1 ratio by +-0.5)."""
        k = min(self.a.warm_experts, self.a.family_experts)
        fam, cat = self.family(self.a.preset, self.a.family_experts)
        shm = "/dev/shm/mergepipe-bench-warm"
        for rep in range(self.a.reps):
            for method in ("linear", "ties"):
                cfg = self.config(fam, k, method)
                for ranks, threads in ((1, 1), (2, 1), (1, 2)):
                    with open(os.devnull, "wb") as null:
                        self.run(["cat", *self.input_files(fam, k)], stdout=null)  # warm
                    shutil.rmtree(shm, ignore_errors=True)
                    cmd = ["mpirun", "-np", str(ranks), *binding(threads), self.mp, "merge", cfg,
                           "--catalog", cat,
                           "--budget", "100%", "--out", shm, "--quiet", "--threads", str(threads)]
                    t0 = time.monotonic()
                    self.run(cmd)
                    wall = time.monotonic() - t0
                    with open(os.path.join(shm, "mergepipe.manifest.json")) as f:
                        m = json.load(f)
                    b = m["bytes_read"]
                    moved = b["base"] + b["expert"] + b["output_written"]
                    if m["input_io"]["direct_files"]:  # auto must read cached files from memory
                        log(f"   warning: {m['input_io']['direct_files']} warm input files read "
                            "with O_DIRECT")
                    self.record(suite="warm", preset=self.a.preset, experts=k, method=method,
                                config=f"{ranks}x{threads}", budget="100%", ranks=ranks,
                                threads=threads, rep=rep, wall_s=round(wall, 3),
                                expert_bytes=b["expert"], base_bytes=b["base"],
                                output_bytes=b["output_written"], bytes_moved=moved,
                                merge_s=m["timings"]["merge"], plan_s=m["timings"]["plan"],
                                peak_rss_bytes=m["peak_rss_bytes"],
                                throughput_bps=round(moved / m["timings"]["merge"]))
                    log(f"   warm {method} {ranks}x{threads}: merge {m['timings']['merge']:.2f} s "
                        f"{moved / m['timings']['merge'] / 1e9:.2f} GB/s")
        shutil.rmtree(shm, ignore_errors=True)

    def suite_device(self):
        """Whether this disk reads and writes at once or in turn: a cold direct read of the base
        and two experts, a direct write of an output-sized file, then both together. The bound
        (reads / read bandwidth + output / write bandwidth) assumes they take turns, i.e. that
        the pair together takes the sum of the two alone; if the device did both at once it
        would take the longer of the two, and the bound would be too loose."""
        fam, _ = self.family(self.a.preset, self.a.family_experts)
        files = self.input_files(fam, 2)
        read_bytes = sum(os.path.getsize(f) for f in files)
        out_bytes = os.path.getsize(files[0])  # an output is the size of a checkpoint
        for rep in range(self.a.reps):
            os.sync()
            read_s = self.direct_read(files)
            os.sync()
            written, write_s = self.direct_write(out_bytes)
            self.evict(*files)
            os.sync()
            done = {}

            def write_now():
                done["write"] = self.direct_write(out_bytes, "write-probe-concurrent.bin")[1]
            t0 = time.monotonic()
            writer = threading.Thread(target=write_now)
            writer.start()
            both_read = self.direct_read(files)
            writer.join()
            both = time.monotonic() - t0
            for config, wall, moved in (("read alone", read_s, read_bytes),
                                        ("write alone", write_s, written),
                                        ("read + write together", both, read_bytes + written),
                                        ("read, while writing", both_read, read_bytes),
                                        ("write, while reading", done["write"], written)):
                self.record(suite="device", preset=self.a.preset, experts=2, config=config, rep=rep,
                            wall_s=round(wall, 3), bytes_moved=moved,
                            throughput_bps=round(moved / wall))
            log(f"   device: read {read_bytes / 1e9:.2f} GB {read_s:.2f} s, write "
                f"{written / 1e9:.2f} GB {write_s:.2f} s, together {both:.2f} s "
                f"(sum {read_s + write_s:.2f}, longer {max(read_s, write_s):.2f})")

    def suite_rss(self):
        """Peak RSS per rank does not grow with model size: the same K and block size for the
        main preset and for Llama-3.1-8B shapes (2 layers: 1 GiB embedding tensors)."""
        self.group("rss", self.a.preset, 4, "ties", ["50%"], 0)
        self.group("rss", "llama-3.1-8b", 4, "ties", ["50%"], 0, family_extra=("--layers", "2"))

    # ---- report ------------------------------------------------------------------------------
    def report(self):
        """Medians over repetitions, one markdown row per configuration."""
        def med(sel, f):
            vals = [float(r[f]) for r in sel if r.get(f, "") != ""]
            return statistics.median(vals) if vals else None

        def fmt(v, spec, scale=1.0, suffix=""):
            return "-" if v is None else format(v / scale, spec) + suffix

        def at_bounds(sel):
            vals = [float(r["full_bound_s"]) / float(r["bound_s"]) for r in sel
                    if r.get("full_bound_s", "") != "" and float(r["bound_s"]) > 0]
            return statistics.median(vals) if vals else None

        cols = ("suite", "preset", "experts", "method", "config", "ranks", "threads")
        states = sorted({r.get("page_reporting") or "not recorded" for r in self.rows})
        print(f"\nFree page reporting (VM) during these runs: {', '.join(states)}.")
        states = sorted({r.get("damon") or "not recorded" for r in self.rows})
        print(f"DAMON reclaim during these runs: {', '.join(states)}.")
        keys = []
        device = [r for r in self.rows if r["suite"] == "device"]
        merges = [r for r in self.rows if r["suite"] != "device"]  # device rows have no method
        for r in merges:
            key = tuple(r[c] for c in cols)
            if key not in keys:
                keys.append(key)
        # "at the bounds": the full read's bound over this run's, the speedup both runs would show
        # at their I/O bounds (reads and writes at the probes' bandwidths).
        if keys:
            print("\n| suite | preset | K | method | config | ranks x threads | reps | wall s | expert GB "
                  "| moved GB | bound s | wall / bound | speedup vs full read | speedup at the bounds "
                  "| peak RSS MiB | plan % | rel. deviation |")
            print("|" + " --- |" * 17)
            for key in keys:
                sel = [r for r in merges if tuple(r[c] for c in cols) == key]
                wall, plan = med(sel, "wall_s"), med(sel, "plan_s")
                print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {key[5]}x{key[6]} | "
                      f"{len(sel)} | {fmt(wall, '.2f')} | {fmt(med(sel, 'expert_bytes'), '.2f', 1e9)} | "
                      f"{fmt(med(sel, 'bytes_moved'), '.2f', 1e9)} | {fmt(med(sel, 'bound_s'), '.2f')} | "
                      f"{fmt(med(sel, 'ratio'), '.2f')} | {fmt(med(sel, 'speedup_vs_full'), '.2f', 1, 'x')} | "
                      f"{fmt(at_bounds(sel), '.2f', 1, 'x')} | {fmt(med(sel, 'peak_rss_bytes'), '.0f', 2**20)} | "
                      f"{fmt(None if plan is None else 100 * plan / wall, '.3f')} | "
                      f"{fmt(med(sel, 'deviation_rel_l2'), '.2e')} |")

        repeated = [key for key in keys
                    if sum(1 for r in merges if tuple(r[c] for c in cols) == key) > 1]
        if repeated:
            # The medians above hide the spread; on this noisy machine the spread is the finding.
            print("\nPer repetition:\n")
            for key in repeated:
                sel = sorted((r for r in merges if tuple(r[c] for c in cols) == key),
                             key=lambda r: int(r["rep"]))

                def each(f, spec, suffix=""):
                    return ", ".join(format(float(r[f]), spec) + suffix for r in sel
                                     if r.get(f, "") != "")
                line = f"- {key[0]} {key[1]} K={key[2]} {key[3]} {key[4]} {key[5]}x{key[6]}: " \
                       f"wall {each('wall_s', '.2f')} s"
                if any(r.get("ratio", "") != "" for r in sel):
                    line += f"; wall / bound {each('ratio', '.2f')}"
                if any(r.get("speedup_vs_full", "") != "" and float(r["speedup_vs_full"]) != 1.0
                       for r in sel):
                    line += f"; speedup {each('speedup_vs_full', '.2f', 'x')}"
                print(line)

        warm = [r for r in merges if r["suite"] == "warm"]
        if warm:
            # The SPEC's scaling bar: 2 ranks against 1 on a warm cache, by merge time.
            print("\n| warm method | reps | 1x1 merge s | 2x1 merge s | 1x2 merge s "
                  "| 2x1 vs 1x1: ratio of medians | per repetition |")
            print("|" + " --- |" * 7)
            for method in sorted({r["method"] for r in warm}):
                def times(config):
                    return {int(r["rep"]): float(r["merge_s"]) for r in warm
                            if r["method"] == method and r["config"] == config}
                one, two, both = times("1x1"), times("2x1"), times("1x2")
                per_rep = [one[k] / two[k] for k in sorted(one) if k in two]
                mid = lambda d: statistics.median(d.values()) if d else None
                ratio = mid(one) / mid(two) if one and two else None
                print(f"| {method} | {len(per_rep)} | {fmt(mid(one), '.2f')} | {fmt(mid(two), '.2f')} | "
                      f"{fmt(mid(both), '.2f')} | {fmt(ratio, '.2f', 1, 'x')} | "
                      f"{', '.join(f'{x:.2f}x' for x in per_rep) or '-'} |")

        if device:
            # Medians of each probe; "together / sum" near 1: reads and writes take turns.
            def probe(config):
                return med([r for r in device if r["config"] == config], "wall_s")
            read_s, write_s = probe("read alone"), probe("write alone")
            both = probe("read + write together")
            print("\n| probe | reps | GB | s | GB/s |")
            print("|" + " --- |" * 5)
            for config in ("read alone", "write alone", "read + write together",
                           "read, while writing", "write, while reading"):
                sel = [r for r in device if r["config"] == config]
                print(f"| {config} | {len(sel)} | {fmt(med(sel, 'bytes_moved'), '.2f', 1e9)} | "
                      f"{fmt(med(sel, 'wall_s'), '.2f')} | {fmt(med(sel, 'throughput_bps'), '.2f', 1e9)} |")
            print(f"\nTogether {both:.2f} s against {read_s + write_s:.2f} s for the two alone in turn "
                  f"(together / sum {both / (read_s + write_s):.2f}) and {max(read_s, write_s):.2f} s "
                  f"for the longer alone (together / longer {both / max(read_s, write_s):.2f}).")

        if self.catalogs:
            print("\n| family | K | family GB | catalog MB | catalog / family | catalog build s (2 ranks, cold) |")
            print("|" + " --- |" * 6)
            for name, c in self.catalogs.items():
                print(f"| {name} | {c['experts']} | {c['family_bytes'] / 1e9:.2f} | "
                      f"{c['catalog_bytes'] / 1e6:.2f} | {100 * c['catalog_bytes'] / c['family_bytes']:.3f}% | "
                      f"{c['build_s']:.1f} |")

    def plots(self):
        if not shutil.which("gnuplot"):
            log("gnuplot missing: no plots (apt-get install gnuplot-nox)")
            return
        os.makedirs(self.a.plots, exist_ok=True)
        data = os.path.join(self.a.plots, "plot-data")
        os.makedirs(data, exist_ok=True)

        def med(sel, f):
            vals = [float(r[f]) for r in sel if r.get(f, "") != ""]
            return statistics.median(vals) if vals else float("nan")

        def dat(name, header, lines):
            path = os.path.join(data, name)
            with open(path, "w") as f:
                f.write("# " + header + "\n" + "\n".join(lines) + "\n")
            return path

        scripts = []
        k_rows = [r for r in self.rows if r["suite"] == "k"]
        if k_rows:
            lines = []
            for k in sorted({r["experts"] for r in k_rows}, key=int):  # strings from --report
                cell = lambda m, c: [r for r in k_rows if r["experts"] == k and r["method"] == m
                                     and r["config"] == c]
                lines.append(" ".join(str(x) for x in (
                    k, med(cell("ties", "full-read"), "expert_bytes") / 1e9,
                    med(cell("ties", "budget 10%"), "expert_bytes") / 1e9,
                    med(cell("ties", "full-read"), "wall_s"), med(cell("ties", "budget 10%"), "wall_s"),
                    med(cell("linear", "full-read"), "wall_s"),
                    med(cell("linear", "budget 10%"), "wall_s"))))
            p = dat("k.dat", "K full_GB budget10_GB ties_full_s ties_10_s linear_full_s linear_10_s",
                    lines)
            scripts.append(f"""
set output '{self.a.plots}/io_vs_k.png'; set multiplot layout 1,2 title 'Cold cache, 2 ranks, {self.a.preset}'
set xlabel 'experts K'; set ylabel 'expert GB read'; set key left top
plot '{p}' u 1:2 w lp t 'full read (TIES)', '' u 1:3 w lp t '10% budget (TIES)'
set ylabel 'wall time s'
plot '{p}' u 1:4 w lp t 'TIES full read', '' u 1:5 w lp t 'TIES 10%', '' u 1:6 w lp t 'linear full read', '' u 1:7 w lp t 'linear 10%'
unset multiplot""")
        b_rows = [r for r in self.rows if r["suite"] == "budget"]
        if b_rows:
            for method in ("linear", "ties", "dare_ties"):
                lines = []
                for budget in ("100%", "50%", "25%", "10%", "5%"):
                    sel = [r for r in b_rows if r["method"] == method and r["budget"] == budget]
                    if sel:
                        lines.append(f"{budget[:-1]} {med(sel, 'wall_s')} {med(sel, 'bytes_moved') / 1e9} "
                                     f"{med(sel, 'bound_s')} {med(sel, 'deviation_rel_l2')}")
                full = [r for r in b_rows if r["method"] == method and r["config"] == "full-read"]
                lines.append(f"# full-read {med(full, 'wall_s')}")
                dat(f"budget-{method}.dat", "budget% wall_s moved_GB bound_s rel_dev", lines)
            d = lambda m: os.path.join(data, f"budget-{m}.dat")
            scripts.append(f"""
set output '{self.a.plots}/wall_vs_budget.png'; set multiplot layout 1,2 title 'Cold cache, K={self.a.family_experts}, 2 ranks'
set xlabel 'budget % of the full expert read'; set ylabel 'wall time s'; set key left top
plot '{d("linear")}' u 1:2 w lp t 'linear', '{d("ties")}' u 1:2 w lp t 'ties', '{d("dare_ties")}' u 1:2 w lp t 'dare\\_ties', '{d("ties")}' u 1:4 w l dt 2 t 'I/O lower bound (ties)'
set ylabel 'bytes moved GB'
plot '{d("linear")}' u 1:3 w lp t 'linear', '{d("ties")}' u 1:3 w lp t 'ties', '{d("dare_ties")}' u 1:3 w lp t 'dare\\_ties'
unset multiplot
set output '{self.a.plots}/frontier.png'; set title 'Speed-fidelity frontier (K={self.a.family_experts}, budgets 5-50%)'
set xlabel 'wall time s'; set ylabel 'relative L2 deviation from the full read'; set logscale y; set key right top
plot '{d("linear")}' u 2:($5>0?$5:1/0):(sprintf('%d%%',$1)) w lp t 'linear', '' u 2:($5>0?$5:1/0):(sprintf('%d%%',$1)) w labels offset 1,0.5 notitle, \\
     '{d("ties")}' u 2:($5>0?$5:1/0) w lp t 'ties', '{d("dare_ties")}' u 2:($5>0?$5:1/0) w lp t 'dare\\_ties'
unset logscale y; unset title""")
        w_rows = [r for r in self.rows if r["suite"] in ("warm", "ranks")]
        if w_rows:
            lines = []
            for suite in ("warm", "ranks"):
                for method in sorted({r["method"] for r in w_rows if r["suite"] == suite}):
                    for cfg in ((1, 1), (1, 2), (2, 1)):
                        sel = [r for r in w_rows if r["suite"] == suite and r["method"] == method
                               and int(r["ranks"]) == cfg[0] and int(r["threads"]) == cfg[1]
                               and r["config"] != "full-read"]
                        if sel:
                            what = "cold 10%" if suite == "ranks" else "warm"
                            lines.append(f"\"{what} {method}\" {cfg[0]}x{cfg[1]} "
                                         f"{med(sel, 'throughput_bps') / 1e9}")
            p = dat("scaling.dat", "case ranks_x_threads GB/s", lines)
            scripts.append(f"""
set output '{self.a.plots}/scaling.png'; set title 'Throughput (bytes moved / s) by ranks x threads'
set style data histogram; set style histogram cluster gap 1; set style fill solid 0.7; set ylabel 'GB/s'
set xtics rotate by -20; set key off; set xlabel 'merge, ranks x threads'; set yrange [0:*]
plot '{p}' u 3:xtic(sprintf('%s %s', stringcolumn(1), stringcolumn(2)))""")
        script = "set terminal pngcairo size 1200,480 font ',10'\nset grid\n" + "\n".join(scripts)
        path = os.path.join(data, "plots.gp")
        with open(path, "w") as f:
            f.write(script)
        subprocess.run(["gnuplot", path], check=False)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="headline", help="comma-separated: headline,k,budget,ranks,"
                   "warm,rss,device or all")
    p.add_argument("--preset", default="qwen3-0.6b")
    p.add_argument("--warm-experts", type=int, default=8,
                   help="K of the warm suite (its inputs must fit in the page cache)")
    p.add_argument("--family-experts", type=int, default=20, help="K of the main family")
    p.add_argument("--k-values", default="2,5,10,20")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--dir", default="/tmp/mergepipe-bench")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--csv", default="bench-results.csv")
    p.add_argument("--plots", default="bench-plots")
    p.add_argument("--quick", action="store_true",
                   help="small family (qwen3-0.6b shapes, 2 layers, hidden 512), K=4, one rep")
    p.add_argument("--page-reporting", choices=("keep", "off"), default="keep",
                   help="off: turn the VM's free page reporting off for the run (root; restored "
                   "at exit), so that memory freed by one run is not handed back to the host and "
                   "faulted in again, slowly, by the next")
    p.add_argument("--damon", choices=("keep", "off"), default="keep",
                   help="off: stop the kernel's DAMON reclaim for the run (root; restored at "
                   "exit), so that it does not page out cached inputs between and during runs")
    p.add_argument("--report", metavar="CSV",
                   help="run nothing: print the tables and draw the plots of a saved CSV "
                   "(the catalog table needs the live run and is left out)")
    a = p.parse_args()
    if a.report:
        with open(a.report, newline="") as f:
            b = Bench(a, rows=list(csv.DictReader(f)))
        b.report()
        b.plots()
        return
    if a.quick:
        a.family_experts, a.k_values, a.reps = 4, "2,4", 1
    a.k_values = [int(x) for x in a.k_values.split(",")]
    suites = ["headline", "k", "budget", "ranks", "warm", "rss", "device"] if a.suite == "all" \
        else a.suite.split(",")
    vm_settings.apply(a.page_reporting, a.damon)
    b = Bench(a)
    if a.quick:
        orig = b.family
        b.family = lambda preset, k, extra=(): orig(preset, k, tuple(extra) or
                                                    ("--layers", "2", "--hidden", "512"))
    for s in suites:
        getattr(b, "suite_" + s)()
    b.report()
    b.plots()


if __name__ == "__main__":
    main()
