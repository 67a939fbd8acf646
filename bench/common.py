"""Helpers shared by the PostgreSQL-level benchmarks (bench/lifetimes, bench/sets,
bench/snapshots).

Their bench.py scripts put this directory on sys.path and import from here: printing and
writing results (log, write_csv, md_table, pct), CPU time from /proc, which gsnap build is
measured, the gsnap worker's pid, and BenchBase (the clusters of a run and its summary.json).
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import cluster  # noqa: E402
from cluster import PGBIN  # noqa: E402

__all__ = ["ROOT", "PGBIN", "Cluster", "log", "write_csv", "md_table", "pct", "proc_stat", "cpu_ms", "installed_gsnap",
           "version_line", "worker_pid", "perf_report", "stale_gsnap_mapping", "arg_parser", "BenchBase"]


class Cluster(cluster.Cluster):
    """A benchmark's cluster: its sessions never prepare statements on their own (psycopg
    prepares a query run five times, and a prepared plan keeps the planner settings it was
    made with: a benchmark that runs one query under several settings, serial and parallel
    say, would measure one plan for all of them)."""

    def connect(self, dbname: str = "postgres", user: str = "postgres", **kw):
        kw.setdefault("prepare_threshold", None)
        return super().connect(dbname, user, **kw)


def log(msg: str) -> None:
    print(msg, flush=True)


def write_csv(path: Path, rows: list[dict]) -> None:
    """rows as CSV, the columns being every key in order of first appearance."""
    if not rows:
        return
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def md_table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table (printed, and pasted into the README)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def pct(values, p):
    """The p-th percentile (0-100) of values, by linear interpolation."""
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def read_stat(path: str) -> tuple[str, list[str]] | None:
    """The name and the fields after it of a `stat` file of /proc (a process's, or one of its
    threads' under task/); None once it is gone."""
    try:
        with open(path) as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):  # gone (a thread may end between the two)
        return None
    return text[text.index("(") + 1:text.rindex(")")], text.rsplit(")", 1)[1].split()


def stat_cpu_ms(fields: list[str]) -> float:
    """User + system CPU time in ms (clock-tick resolution) of `read_stat` fields."""
    return (int(fields[11]) + int(fields[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> tuple[float, int]:
    """(user + system CPU time in ms (clock-tick resolution), minor page faults) of a process;
    (nan, 0) once it is gone."""
    stat = read_stat(f"/proc/{pid}/stat")
    if stat is None:
        return float("nan"), 0
    fields = stat[1]
    return stat_cpu_ms(fields), int(fields[7])


def cpu_ms(pid: int) -> float:
    """User + system CPU time of a process, in ms."""
    return proc_stat(pid)[0]


def threads_cpu_ms(pid: int) -> float:
    """CPU time of a process's live threads, in ms at nanosecond resolution (the first field of
    each thread's `schedstat`): for spans in which none of its threads ends, such as one query's
    (`cpu_ms` counts clock ticks of 10 ms). nan once the process is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return float("nan")
    total = 0
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            pass
    return total / 1e6


def installed_gsnap() -> dict:
    """Which gsnap is measured: the installed library (hash, install time) and the repository's
    state (HEAD and the number of modified tracked files)."""
    libdir = subprocess.run([str(PGBIN / "pg_config"), "--pkglibdir"], capture_output=True, text=True).stdout.strip()
    so = Path(libdir) / "gsnap.so"

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()

    return {"gsnap_so_sha256": hashlib.sha256(so.read_bytes()).hexdigest()[:16] if so.exists() else None,
            "gsnap_so_mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(so.stat().st_mtime))
            if so.exists() else None,
            "git_head": git("rev-parse", "--short", "HEAD"),
            "git_dirty_files": len([ln for ln in git("status", "--porcelain", "--untracked-files=no").splitlines()
                                    if ln])}


def version_line(v: dict) -> str:
    """The first line of a run's log: the build measured."""
    return (f"gsnap.so {v['gsnap_so_sha256']} installed {v['gsnap_so_mtime']}; repository at {v['git_head']} "
            f"with {v['git_dirty_files']} modified files")


def worker_pid(conn, timeout_s: float = 30.0) -> int:
    """The pid of the gsnap worker of conn's cluster, once it is ready."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        row = conn.execute("SELECT worker_pid FROM gsnap_progress() WHERE worker = 'ready'").fetchone()
        if row and row[0]:
            return row[0]
        time.sleep(0.1)
    raise RuntimeError("the gsnap worker is not ready")


def perf_report(data: Path, names: dict[int, str], classify, title: str, path: Path) -> dict:
    """Summarizes the perf recording `data` (of the processes `names`: pid -> name; their
    other threads count as "NAME-thread") into the text file `path`: the share of the samples
    by process, by component (`classify(dso, symbol)` names it) and the top 30 symbols. Removes
    the recording; returns the shares by process and by component (those of 1% or more)."""
    names = dict(names)
    for pid, name in list(names.items()):
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                if int(tid) != pid:
                    names[int(tid)] = f"{name}-thread"
        except FileNotFoundError:
            pass
    stale = stale_gsnap_mapping(names)
    rep = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "pid,dso,sym", "--stdio",
                          "-g", "none", "--percent-limit", "0"], capture_output=True, text=True).stdout
    os.remove(data)
    by_proc: dict[str, float] = {}
    by_comp: dict[tuple[str, str], float] = {}
    top: list[tuple[float, str, str]] = []
    for line in rep.splitlines():
        p = line.split()
        if line.startswith("#") or len(p) < 4 or not p[0].endswith("%"):
            continue
        share = float(p[0][:-1])
        proc = names.get(int(p[1].split(":")[0]), "other")
        sym = " ".join(p[3:])
        by_proc[proc] = by_proc.get(proc, 0.0) + share
        comp = (proc, classify(p[2], sym))
        by_comp[comp] = by_comp.get(comp, 0.0) + share
        top.append((share, proc, sym))
    comps = sorted(by_comp.items(), key=lambda kv: -kv[1])
    lines = [title, ""]
    if stale:
        lines += [f"WARNING: {stale}: the gsnap.so symbols below are resolved against another build and are "
                  "wrong (the other libraries' are right)", ""]
    lines += ["share of samples by process:"]
    lines += [f"  {v:6.2f}%  {k}" for k, v in sorted(by_proc.items(), key=lambda kv: -kv[1])]
    lines += ["", "by component:"]
    lines += [f"  {v:6.2f}%  {k[0]:14s} {k[1]}" for k, v in comps if v >= 0.5]
    lines += ["", "top symbols:"]
    lines += [f"  {sh:6.2f}%  {proc:14s} {sym[:110]}" for sh, proc, sym in sorted(top, reverse=True)[:30]]
    path.write_text("\n".join(lines) + "\n")
    res = {"by_process": {k: round(v, 1) for k, v in by_proc.items()},
           "by_component": {f"{k[0]}: {k[1]}": round(v, 1) for k, v in comps if v >= 1.0}}
    if stale:
        log(f"   WARNING: {stale}; the profile's gsnap.so symbols are wrong")
        res["gsnap_so_symbols_wrong"] = stale
    return res


def stale_gsnap_mapping(names: dict[int, str]) -> str | None:
    """Whether a profiled process maps a gsnap.so that is no longer the installed file (it was
    reinstalled since the server started; perf report would read the new file's symbols)."""
    for pid, name in names.items():
        try:
            with open(f"/proc/{pid}/maps") as f:
                if any("gsnap.so" in line and line.rstrip().endswith("(deleted)") for line in f):
                    return f"gsnap.so was reinstalled after the {name} (pid {pid}) loaded it"
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return None


def arg_parser(doc: str, benchmarks: list[str], out: Path, quick_help: str) -> argparse.ArgumentParser:
    """The options every bench.py has: --quick, --only (of `benchmarks`), --out, --keep."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--only", default=",".join(benchmarks), help="comma-separated, of: " + ", ".join(benchmarks))
    ap.add_argument("--out", default=str(out), help="the results directory")
    ap.add_argument("--keep", action="store_true", help="keep the clusters' data directories")
    return ap


class BenchBase:
    """The clusters of one benchmark run (all removed at the end unless --keep) and its
    summary.json under --out."""

    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.clusters: list[Cluster] = []
        self.summary: dict = {"mode": "quick" if args.quick else "full", "started": time.strftime("%Y-%m-%d %H:%M:%S")}

    def keep_earlier(self, benchmarks: list[str], only: set[str]) -> None:
        """A partial run (--only) updates the figures of the benchmarks it runs and keeps the
        others' from the summary.json of the last run (that run's build as version_earlier)."""
        prev = self.out / "summary.json"
        if set(benchmarks) <= only or not prev.exists():
            return
        try:
            kept = json.loads(prev.read_text())
        except ValueError:
            return
        for k in [*benchmarks, "profiles", "durations_s", "versions"]:
            if k in kept:
                self.summary[k] = kept[k]
        if "version" in kept:
            self.summary["version_earlier"] = kept["version"]

    def start_cluster(self, name: str, conf: list[str]) -> Cluster:
        """A new cluster with these postgresql.conf lines, started, with the extension created."""
        c = Cluster(name, conf)
        self.clusters.append(c)
        c.start()
        with c.connect() as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS gsnap")
        return c

    def drop(self, c: Cluster) -> None:
        if self.args.keep:
            c.stop()
            log(f"   (kept {c.data})")
        else:
            c.destroy()
        self.clusters.remove(c)

    def close(self) -> None:
        for c in list(self.clusters):
            self.drop(c)

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=2, default=str))

    def run(self, benchmarks: list, only: set[str], then=None) -> int:
        """Runs the benchmarks (name, fn(self)) named in only, in order, then then() if given (the
        profiles); records the build measured, each benchmark's duration and the build it ran
        against (with a warning if gsnap.so was reinstalled meanwhile: clusters started or
        restarted after that measured another build); drops the clusters at the end."""
        self.summary["version"] = installed_gsnap()
        log(version_line(self.summary["version"]))
        t = time.time()
        try:
            for name, fn in benchmarks:
                if name not in only:
                    continue
                t1 = time.time()
                before = self.summary.setdefault("versions", {})[name] = installed_gsnap()
                fn(self)
                self.summary.setdefault("durations_s", {})[name] = round(time.time() - t1, 1)
                if installed_gsnap()["gsnap_so_sha256"] != before["gsnap_so_sha256"]:
                    log(f"WARNING: gsnap.so was reinstalled during benchmark {name}: clusters started or "
                        "restarted after that measured another build")
                    before["reinstalled_during"] = True
                self.save()
            if then is not None:
                then()
        finally:
            self.close()
        self.summary["total_s"] = round(time.time() - t, 1)
        self.save()
        log(f"done in {time.time() - t:.0f} s; results in {self.out}")
        return 0
