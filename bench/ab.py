#!/usr/bin/env python3
"""A/B comparison of two mergepipe builds (or two option sets) on the same cold merge, run
alternately so the machine's drift hits both alike. Standard library only.

  bench/ab.py --family FAM --experts 20 --method ties --budget 10% \\
      --a /tmp/old/bin/mergepipe --b build/bin/mergepipe --reps 3
  bench/ab.py ... --a build/bin/mergepipe --a-args "--io-threads 1" --b-args "--io-threads 4"
  bench/ab.py ... --ranks 1 --a build/bin/mergepipe --b build/bin/mergepipe \
      --b-mpirun-args "--bind-to none"

  bench/ab.py ... --budget 100% --warm --ranks 1 --a build/bin/mergepipe --a-args \
      "--io-threads 8" --b build/bin/mergepipe --reps 4

Needs the family's catalog at FAM.catalog (bench/run.py makes both), or one per side with
--a-catalog and --b-catalog (two catalog formats side by side). Prints one line per run and the
medians of the wall and merge times; --budget full runs --full-read. --warm: the inputs are read
into the page cache before each run instead of evicted, and the output goes to tmpfs
(/dev/shm), as in run.py's warm suite: compute-bound runs, compared by their merge time.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import time

import vm_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# OMPI_MCA_pml: skip the cm PML, whose PSM transports wait ~0.2 s at start-up on a machine
# without their hardware (docs/cluster.md); a value set by the caller wins.
ENV = {"OMPI_MCA_pml": "^cm", **os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1",
       "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", required=True)
    p.add_argument("--experts", type=int, required=True)
    p.add_argument("--method", default="ties")
    p.add_argument("--budget", default="10%", help="a budget, or 'full' for --full-read")
    p.add_argument("--a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--a-args", default="")
    p.add_argument("--b-args", default="")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--a-mpirun-args", default="", help="mpirun options of A, e.g. '--bind-to none'")
    p.add_argument("--b-mpirun-args", default="", help="mpirun options of B")
    p.add_argument("--a-catalog", default="", help="catalog folder of A (default: FAM.catalog)")
    p.add_argument("--b-catalog", default="", help="catalog folder of B")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warm", action="store_true",
                   help="inputs in the page cache, output on tmpfs (instead of cold, on disk)")
    p.add_argument("--reader", default=os.path.join(ROOT, "build", "bin", "read_files"))
    p.add_argument("--page-reporting", choices=("keep", "off"), default="keep",
                   help="off: the VM's free page reporting off for the run (root; as run.py)")
    p.add_argument("--damon", choices=("keep", "off"), default="keep",
                   help="off: the kernel's DAMON reclaim stopped for the run (root; as run.py)")
    a = p.parse_args()
    vm_settings.apply(a.page_reporting, a.damon)
    fam = os.path.abspath(a.family)
    cfg = os.path.join(os.path.dirname(fam), f"ab-{a.method}-{a.experts}.yaml")
    with open(cfg, "w") as f:
        f.write(f"merge_method: {a.method}\nbase_model: {fam}/base\nmodels:\n")
        for i in range(a.experts):
            f.write(f"  - {{model: {fam}/expert{i:02d}, parameters: {{weight: 1.0, density: 0.5}}}}\n")
    out = "/dev/shm/mergepipe-ab-out" if a.warm else os.path.join(os.path.dirname(fam), "ab-out")
    inputs = [os.path.join(fam, d, n) for d in ["base"] + [f"expert{i:02d}" for i in range(a.experts)]
              for n in sorted(os.listdir(os.path.join(fam, d))) if n.endswith(".safetensors")]
    walls = {"A": [], "B": []}
    merges = {"A": [], "B": []}
    for rep in range(a.reps):
        runs = (("A", a.a, a.a_args, a.a_mpirun_args, a.a_catalog or fam + ".catalog"),
                ("B", a.b, a.b_args, a.b_mpirun_args, a.b_catalog or fam + ".catalog"))
        for name, exe, extra, launch, catalog in runs if rep % 2 == 0 else runs[::-1]:
            shutil.rmtree(out, ignore_errors=True)
            if a.warm:
                with open(os.devnull, "wb") as null:
                    subprocess.run(["cat", *inputs], stdout=null, check=True)
            else:
                subprocess.run([a.reader, "--evict", fam, catalog], check=True)
            cmd = ["mpirun", "-np", str(a.ranks), *launch.split(), exe, "merge", cfg,
                   "--out", out, "--quiet",
                   *extra.split()]
            cmd += ["--full-read"] if a.budget == "full" else ["--catalog", catalog,
                                                               "--budget", a.budget]
            t0 = time.monotonic()
            subprocess.run(cmd, env=ENV, check=True)
            os.sync()
            wall = time.monotonic() - t0
            with open(os.path.join(out, "mergepipe.manifest.json")) as f:
                m = json.load(f)
            t = m["timings"]
            ahead = m.get("base_read_ahead", {}).get("bytes", 0)
            ahead_wait = m.get("base_read_ahead", {}).get("wait_seconds", 0)
            walls[name].append(wall)
            merges[name].append(t["merge"])
            print(f"rep {rep} {name}: {wall:.2f} s  (catalog {t.get('catalog_load', 0):.2f}, merge {t['merge']:.2f}, read_wait "
                  f"{t['read_wait']:.2f}, compute {t['compute']:.2f}, write {t['write']:.2f}, sync "
                  f"{t['output_sync']:.2f}, base read ahead {ahead / 1e9:.2f} GB, waited for "
                  f"{ahead_wait:.2f} s)",
                  flush=True)
    shutil.rmtree(out, ignore_errors=True)
    ma, mb = statistics.median(walls["A"]), statistics.median(walls["B"])
    print(f"median A {ma:.2f} s, B {mb:.2f} s, B/A {mb / ma:.3f}")
    ma, mb = statistics.median(merges["A"]), statistics.median(merges["B"])
    print(f"merge phase: median A {ma:.2f} s, B {mb:.2f} s, B/A {mb / ma:.3f}")


if __name__ == "__main__":
    main()
