"""Two memory features of a VM guest that change benchmark timings, and how run.py and ab.py turn
them off for the length of a run (root only) and restore them at exit. Standard library only.

Free page reporting (virtio-balloon): the guest hands the pages it frees back to the host, which
backs them again only when they are next touched. On the test VM, writing 1.5 GB to tmpfs ran at
0.55-0.62 GB/s into reported pages and at 3.9-5.8 GB/s into pages freed a moment before. Every
merge allocates its buffers and its output pages afresh, so this adds up to seconds to a run, as
the host's timing decides: the warm suite's 1-rank merges took 2.1-5.2 s with reporting on,
1.9-2.9 s with it off (5 repetitions each, linear and TIES). Reporting covers free blocks of
2^order pages; no block is larger than 2^10 pages, so order 11 reports nothing.

DAMON reclaim (a kdamond with a `pageout` scheme): the kernel samples which physical pages are
accessed and pages out those it finds idle. On the test VM (pages idle for 12 aggregation
intervals of 5 s, at most 128 MiB/s), 13.5 GB of inputs read with `cat` lost 40 MB of their cached
pages within 10 s and 390 MB within 90 s: a sampled region mixes pages read a moment ago with old
ones. A warm merge then reads part of its inputs from the disk, and a run that finds a shard
partly evicted uses 8 readers instead of 1 (`--io-threads 0`).
"""
import atexit
import glob
import os
import signal
import sys

PAGE_REPORTING_ORDER = "/sys/module/page_reporting/parameters/page_reporting_order"
NO_REPORTING_ORDER = "11"
KDAMOND_STATES = "/sys/kernel/mm/damon/admin/kdamonds/*/state"
DAMON_RECLAIM_ENABLED = "/sys/module/damon_reclaim/parameters/enabled"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def read(path):
    with open(path) as f:
        return f.read().strip()


def write(path, value):
    with open(path, "w") as f:
        f.write(value)


class Setting:
    """A machine setting changed until exit: `saved` maps each file written to its old value."""
    name = ""

    def __init__(self):
        self.saved = {}

    def turn_off(self):
        changes = self.changes()
        if not changes:
            return
        try:
            for path, value in changes.items():
                old = read(path)
                write(path, value)
                self.saved[path] = old
        except OSError as e:
            self.restore()
            sys.exit(f"cannot turn {self.name} off ({e}); it needs root")
        atexit.register(self.restore)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that atexit runs
        log(f"{self.name} off for this run: " +
            ", ".join(f"{p} {self.saved[p]} -> {v}" for p, v in changes.items()))

    def restore(self):
        for path, old in self.saved.items():
            try:
                write(path, old)
            except OSError as e:
                log(f"could not restore {path} to {old}: {e}")
        if self.saved:
            log(f"{self.name} restored")
        self.saved = {}


class PageReporting(Setting):
    name = "free page reporting"

    @staticmethod
    def state():
        try:
            order = read(PAGE_REPORTING_ORDER)
        except OSError:
            return "absent"
        return "off" if int(order) > 10 else f"on (order {order})"

    def changes(self):
        return {PAGE_REPORTING_ORDER: NO_REPORTING_ORDER} if self.state().startswith("on") else {}


class DamonReclaim(Setting):
    name = "DAMON reclaim"

    @staticmethod
    def running():
        """The state files of the kdamonds that run, and the reclaim module's switch if on."""
        paths = [p for p in sorted(glob.glob(KDAMOND_STATES)) if read(p) == "on"]
        if os.path.exists(DAMON_RECLAIM_ENABLED) and read(DAMON_RECLAIM_ENABLED) == "Y":
            paths.append(DAMON_RECLAIM_ENABLED)
        return paths

    @staticmethod
    def state():
        try:
            running = DamonReclaim.running()
        except OSError:
            return "unknown"
        if running:
            return f"on ({len(running)} running)"
        return "off" if glob.glob(KDAMOND_STATES) or os.path.exists(DAMON_RECLAIM_ENABLED) \
            else "absent"

    def changes(self):
        return {p: ("N" if p == DAMON_RECLAIM_ENABLED else "off") for p in self.running()}


def apply(page_reporting, damon):
    """Turns off what the options say ('off'), or warns about what stays on ('keep')."""
    settings = []
    for choice, setting, option, why in (
            (page_reporting, PageReporting(), "--page-reporting off",
             "memory freed between runs goes back to the host, and touching it again is slow and "
             "varies"),
            (damon, DamonReclaim(), "--damon off",
             "it pages out cached input files, so warm runs read part of them from the disk")):
        if choice == "off":
            setting.turn_off()
            settings.append(setting)
        elif setting.state().startswith("on"):
            log(f"note: {setting.name} is {setting.state()}: {why} ({option})")
    return settings
