#!/usr/bin/python3
"""Collects a scaling study made by slurm/scaling-study.sh into STUDY/scaling.csv and plots
STUDY/scaling.png with gnuplot (throughput and parallel efficiency against ranks, one line per
budget). Standard library only.

    /usr/bin/python3 slurm/scaling_collect.py STUDY [--csv FILE] [--png FILE]

Input: STUDY/results/<tag>.json written by every array task (nodes, ranks, threads, budget,
exit code, the job's own measured time) and <tag>.manifest.json, the merge's manifest.

CSV columns, one row per (nodes, ranks per node, budget), sorted by budget then ranks:
  nodes, ranks_per_node, ranks, threads, budget, budget_bytes, status (ok | failed | no-manifest | missing: submitted, no record),
  exit_code, wall_s (manifest timings.total: mergepipe's own end-to-end time),
  job_wall_s (the array task's time around the launcher: srun/mpirun start-up included),
  base_bytes, expert_bytes, output_bytes (manifest bytes_read: base, expert, output_written),
  catalog_bytes, bytes_moved (base + expert + output), throughput_MBps (bytes_moved / wall_s,
  1 MB = 1e6 bytes), throughput_per_rank_MBps (/ ranks), speedup and efficiency relative to the
  row of the same budget with the fewest ranks (speedup = wall_ref / wall;
  efficiency = wall_ref * ranks_ref / (wall * ranks)), plan_hash, job_id.
Exit code: 0 when every cell succeeded, 1 when one failed or none were found.
"""
import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys

COLUMNS = [
    "nodes", "ranks_per_node", "ranks", "threads", "budget", "budget_bytes", "status",
    "exit_code", "wall_s", "job_wall_s", "base_bytes", "expert_bytes", "output_bytes",
    "catalog_bytes", "bytes_moved", "throughput_MBps", "throughput_per_rank_MBps", "speedup",
    "efficiency", "plan_hash", "job_id",
]


def budget_key(budget):
    """Orders budgets numerically: percentages first (by value), then absolute sizes."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*%\s*", budget)
    if m:
        return (0, float(m.group(1)), budget)
    m = re.match(r"\s*([0-9.]+)", budget)
    return (1, float(m.group(1)) if m else 0.0, budget)


def load_rows(study):
    results = os.path.join(study, "results")
    rows = []
    names = sorted(os.listdir(results)) if os.path.isdir(results) else []
    for name in names:
        if not name.endswith(".json") or name.endswith(".manifest.json"):
            continue
        with open(os.path.join(results, name)) as f:
            r = json.load(f)
        row = {c: "" for c in COLUMNS}
        for c in ("nodes", "ranks_per_node", "ranks", "threads", "budget", "exit_code",
                  "job_wall_s", "job_id"):
            row[c] = r.get(c, "")
        manifest = os.path.join(results, r.get("manifest") or "missing")
        if r.get("exit_code") != 0:
            row["status"] = "failed"
        elif not os.path.isfile(manifest):
            row["status"] = "no-manifest"
        else:
            with open(manifest) as f:
                m = json.load(f)
            b = m.get("bytes_read", {})
            wall = float(m.get("timings", {}).get("total", 0.0))
            moved = int(b.get("base", 0)) + int(b.get("expert", 0)) + int(b.get("output_written", 0))
            row.update({
                "status": "ok",
                "budget_bytes": m.get("budget_bytes", ""),
                "wall_s": round(wall, 6),
                "base_bytes": b.get("base", 0),
                "expert_bytes": b.get("expert", 0),
                "output_bytes": b.get("output_written", 0),
                "catalog_bytes": b.get("catalog", 0),
                "bytes_moved": moved,
                "plan_hash": m.get("plan_hash", ""),
            })
            if int(m.get("ranks", row["ranks"])) != int(row["ranks"]):
                print(f"scaling_collect: warning: {name}: the manifest says {m.get('ranks')} ranks, "
                      f"Slurm gave {row['ranks']}", file=sys.stderr)
            if wall > 0:
                row["throughput_MBps"] = round(moved / wall / 1e6, 3)
                row["throughput_per_rank_MBps"] = round(moved / wall / 1e6 / int(row["ranks"]), 3)
        rows.append(row)
    # Cells the driver submitted but that left no record (cancelled, timed out, never started).
    expected = os.path.join(study, "expected.txt")
    have = {n[:-len(".json")] for n in names if n.endswith(".json") and not n.endswith(".manifest.json")}
    if os.path.isfile(expected):
        with open(expected) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 5 or parts[0] in have:
                    continue
                tag, nodes, rpn, threads, budget = parts
                row = {c: "" for c in COLUMNS}
                row.update({"nodes": int(nodes), "ranks_per_node": int(rpn),
                            "ranks": int(nodes) * int(rpn), "threads": int(threads),
                            "budget": budget, "status": "missing"})
                rows.append(row)
    rows.sort(key=lambda r: (budget_key(str(r["budget"])), int(r["ranks"] or 0), int(r["nodes"] or 0)))
    # Speedup and efficiency against the fewest-ranks successful row of the same budget.
    for budget in {r["budget"] for r in rows}:
        same = [r for r in rows if r["budget"] == budget and r["status"] == "ok" and r["wall_s"]]
        if not same:
            continue
        ref = same[0]
        for r in same:
            r["speedup"] = round(ref["wall_s"] / r["wall_s"], 4)
            r["efficiency"] = round(ref["wall_s"] * int(ref["ranks"]) / (r["wall_s"] * int(r["ranks"])), 4)
    return rows


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)


def plot(rows, study, png):
    """Two panels: total throughput vs ranks, efficiency vs ranks; one line per budget."""
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        print("scaling_collect: gnuplot is not installed (apt-get install gnuplot-nox): no plot",
              file=sys.stderr)
        return False
    ok = [r for r in rows if r["status"] == "ok" and r["throughput_MBps"] != ""]
    if not ok:
        print("scaling_collect: no successful cell to plot", file=sys.stderr)
        return False
    budgets = sorted({r["budget"] for r in ok}, key=lambda b: budget_key(str(b)))
    dat = os.path.join(study, "scaling.dat")
    with open(dat, "w") as f:
        for i, b in enumerate(budgets):
            if i:
                f.write("\n\n")
            f.write(f"# budget {b}: ranks nodes throughput_MBps efficiency\n")
            for r in (r for r in ok if r["budget"] == b):
                f.write(f"{r['ranks']} {r['nodes']} {r['throughput_MBps']} {r['efficiency']}\n")
    max_ranks = max(int(r["ranks"]) for r in ok)
    threads = sorted({str(r["threads"]) for r in ok})
    script = os.path.join(study, "scaling.gp")

    def series(column):
        return ", \\\n     ".join(
            f"'{dat}' index {i} using 1:{column} with linespoints lw 2 pt 7 title 'budget {b}'"
            for i, b in enumerate(budgets))

    with open(script, "w") as f:
        f.write(f"""set terminal pngcairo size 1200,480 font ',10'
set output '{png}'
set multiplot layout 1,2 title 'MergePipe merge scaling ({len(ok)} runs, {"/".join(threads)} thread(s) per rank)'
set xlabel 'MPI ranks'
set xrange [0.5:{max_ranks + 0.5}]
set xtics 1
set grid
set key top left
set ylabel 'throughput (MB/s, base + expert + output bytes / wall)'
set yrange [0:*]
plot {series(3)}
set ylabel 'parallel efficiency (vs fewest ranks)'
set yrange [0:1.2]
plot {series(4)}, 1 with lines dt 2 lc 'gray' notitle
unset multiplot
""")
    res = subprocess.run([gnuplot, script], capture_output=True, text=True)
    if res.returncode != 0 or not os.path.isfile(png) or os.path.getsize(png) == 0:
        print(f"scaling_collect: gnuplot failed: {res.stderr.strip()}", file=sys.stderr)
        return False
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study")
    ap.add_argument("--csv")
    ap.add_argument("--png")
    a = ap.parse_args()
    study = os.path.abspath(a.study)
    csv_path = a.csv or os.path.join(study, "scaling.csv")
    png = os.path.abspath(a.png or os.path.join(study, "scaling.png"))
    rows = load_rows(study)
    if not rows:
        print(f"scaling_collect: no results in {study}/results", file=sys.stderr)
        return 1
    write_csv(rows, csv_path)
    print(f"scaling_collect: {len(rows)} row(s) -> {csv_path}")
    with open(csv_path) as f:
        sys.stdout.write(f.read())
    if plot(rows, study, png):
        print(f"scaling_collect: plot -> {png}")
    bad = [r for r in rows if r["status"] != "ok"]
    for r in bad:
        why = ("submitted but left no record: cancelled, timed out or never started"
               if r["status"] == "missing" else f"exit {r['exit_code']}, job {r['job_id']}")
        print(f"scaling_collect: {r['nodes']} node(s) x {r['ranks_per_node']} rank(s), budget "
              f"{r['budget']}: {r['status']} ({why}; see {study}/logs)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
