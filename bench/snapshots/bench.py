#!/usr/bin/env python3
"""PostgreSQL-level benchmarks of gsnap snapshots (see bench/snapshots/README.md).

    bench.py [--quick] [--only tps,declare,capture,asof] [--out DIR] [--rounds N] ...

1. tps      pgbench TPS: heap tables vs gsnap tables vs gsnap tables with a snapshot every
            10 s, three clusters with identical settings, interleaved rounds.
2. declare  gsnap_snapshot(false) latency (idle and under pgbench), time to durable
            (gsnap_snapshot()), pgbench latency of the transactions that overlap a declaration.
3. capture  full capture of a freshly loaded, warm pgbench database; incremental capture
            after pgbench; bytes per page; the worker's memory during both.
4. asof     count(*) and a full scan of pgbench_accounts, live vs gsnap_asof(), cold and warm.
5. keytps   pgbench TPS with a snapshot every 10 s, key maps on against off (gsnap.key_maps),
            two clusters with identical settings, interleaved rounds, after the maps' start has
            settled (RocksDB compacting their first entries).
6. deltatps the same with page deltas on against off (gsnap.page_deltas): what keeping, with
            each changed page's new image, its delta from the previous image costs pgbench.

Every benchmark prints its figures and writes CSV/JSON under --out; summary.json collects the
target checks. Times vary with the machine's load: alternatives are measured interleaved in
the same run and compared as ratios.
"""
from __future__ import annotations

import glob
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from common import (PGBIN, BenchBase, Cluster, arg_parser, cpu_ms, log, md_table,  # noqa: E402
                    pct, perf_report, read_stat, stat_cpu_ms, threads_cpu_ms, worker_pid, write_csv)

GSNAP_AM = {"PGOPTIONS": "-c default_table_access_method=gsnap"}

# -- helpers ---------------------------------------------------------------------------------


def dir_size(path: Path, by_kind: dict | None = None) -> tuple[int, int]:
    """(apparent bytes, allocated bytes) of the files under path; by_kind (if given) gets the
    apparent bytes per kind of RocksDB file (sst, wal, other)."""
    apparent = allocated = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except FileNotFoundError:
                continue
            apparent += st.st_size
            allocated += st.st_blocks * 512
            if by_kind is not None:
                kind = "sst" if f.endswith(".sst") else "wal" if f.endswith(".log") and f != "LOG" else "other"
                by_kind[kind] = by_kind.get(kind, 0) + st.st_size
    return apparent, allocated


def proc_status(pid: int) -> dict[str, int]:
    """Memory fields of /proc/PID/status, in kB."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "VmSize"):
                    out[k] = int(v.split()[0])
    except FileNotFoundError:
        pass
    return out


def cluster_cpu_ms(c: Cluster) -> float:
    """CPU time used so far by a cluster's server processes: the live ones plus the exited
    children the postmaster reaped (backends of finished connections)."""
    pm = c.postmaster_pid()
    total = 0.0
    tck = os.sysconf("SC_CLK_TCK")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        pid, ppid = int(d), int(fields[1])
        if pid == pm:
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        elif ppid == pm:
            total += int(fields[11]) + int(fields[12])
    return total * 1000.0 / tck


class Bench(BenchBase):
    """Clusters with the benchmark settings, created under one temporary base."""

    def conf(self, shared_buffers: str, extra: list[str] | None = None) -> list[str]:
        return [
            f"shared_buffers = {shared_buffers}",
            f"synchronous_commit = {'on' if self.args.sync_commit else 'off'}",
            "max_wal_size = 8GB",
            "min_wal_size = 1GB",
            "checkpoint_timeout = 30min",
            "max_connections = 60",
            # the image cache and every other gsnap setting at their defaults
            *(extra or []),
        ]

    def cluster(self, name: str, shared_buffers: str, extra: list[str] | None = None) -> Cluster:
        return self.start_cluster(f"bench-{name}", self.conf(shared_buffers, extra))

    def pgbench_init(self, c: Cluster, scale: int, gsnap: bool) -> float:
        t = time.time()
        c.run("pgbench", "-i", "-q", "-s", str(scale), env=GSNAP_AM if gsnap else None)
        return time.time() - t

    def pgbench_cmd(self, c: Cluster, seconds: int, extra: list[str]) -> list[str]:
        a = self.args
        return [str(PGBIN / "pgbench"), "-c", str(a.clients), "-j", str(a.threads), "-M", "prepared",
                "-T", str(seconds), *extra]


def parse_pgbench(out: str) -> dict:
    r = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("tps =") and "without initial connection" in line:
            r["tps"] = float(line.split()[2])
        elif line.startswith("latency average"):
            r["lat_avg_ms"] = float(line.split("=")[1].split()[0])
        elif line.startswith("latency stddev"):
            r["lat_std_ms"] = float(line.split("=")[1].split()[0])
        elif line.startswith("number of transactions actually processed"):
            r["xacts"] = int(line.split(":")[1].split()[0].split("/")[0])
        elif line.startswith("number of failed transactions"):
            r["failed"] = int(line.split(":")[1].split()[0])
    return r


def pgbench_log_lines(prefix: str):
    """The fields of every line of pgbench's log files prefix.* (lines of 6 fields or more),
    removing each file once read."""
    for path in glob.glob(prefix + ".*"):
        with open(path) as f:
            lines = [p for p in (line.split() for line in f) if len(p) >= 6]
        os.remove(path)
        yield from lines


def read_aggregate_logs(prefix: str) -> dict[int, list[float]]:
    """Merged --aggregate-interval logs: second -> [xacts, sum_lat_us, max_lat_us]."""
    agg: dict[int, list[float]] = {}
    for p in pgbench_log_lines(prefix):
        a = agg.setdefault(int(p[0]), [0, 0.0, 0.0])
        a[0] += int(p[1])
        a[1] += float(p[2])
        a[2] = max(a[2], float(p[5]))
    return agg


def read_xact_logs(prefix: str) -> list[tuple[float, float]]:
    """Per-transaction logs: (start time s, latency ms) of every transaction."""
    xs = []
    for p in pgbench_log_lines(prefix):
        lat_us = int(p[2])
        end = int(p[4]) + int(p[5]) / 1e6
        xs.append((end - lat_us / 1e6, lat_us / 1000.0))
    xs.sort()
    return xs


# -- 1. pgbench TPS --------------------------------------------------------------------------


class ThreadCpu(threading.Thread):
    """Samples the CPU time of each thread of process `pid` every `period` s and sums it by
    thread name (the worker's main thread is `postgres`, phase two `gsnap-store`, RocksDB's
    `rocksdb:low`/`rocksdb:high`). A thread that starts and ends between two samples is
    missed, so the sums are a lower bound."""

    def __init__(self, pid: int, period: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.stop_event = threading.Event()
        self.last: dict[str, float] = {}  # CPU seconds by thread id at the last sample
        self.by_name: dict[str, float] = {}

    def sample(self) -> None:
        first = not self.last
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return
        for tid in tids:
            stat = read_stat(f"/proc/{self.pid}/task/{tid}/stat")
            if stat is None:
                continue
            name, fields = stat
            cpu = stat_cpu_ms(fields) / 1000
            # a thread seen for the first time: all its CPU counts, except at the first sample
            before = self.last.get(tid, cpu if first else 0.0)
            self.by_name[name] = self.by_name.get(name, 0.0) + cpu - before
            self.last[tid] = cpu

    def run(self) -> None:
        self.sample()
        while not self.stop_event.wait(self.period):
            self.sample()

    def stop(self) -> dict[str, float]:
        self.stop_event.set()
        self.join()
        self.sample()
        return {k: round(v, 2) for k, v in sorted(self.by_name.items()) if v > 0}


def bench_tps(b: Bench) -> None:
    a = b.args
    scale, secs, rounds = a.scale, a.seconds, a.rounds
    log(f"== 1. pgbench TPS: heap vs gsnap vs gsnap + snapshot every {a.interval} s "
        f"(-s {scale}, -c {a.clients} -j {a.threads} -M prepared, {secs} s runs, {rounds} rounds)")
    configs = ["heap", "gsnap", "gsnap+snap"]
    cl = {name: b.cluster(f"tps-{i}", a.tps_shared_buffers) for i, name in enumerate(configs)}
    for name, c in cl.items():
        dt = b.pgbench_init(c, scale, gsnap=name != "heap")
        log(f"   {name}: pgbench -i -s {scale} in {dt:.1f} s")
    snap_conn = cl["gsnap+snap"].connect()
    t = time.time()
    snap_conn.execute("SELECT gsnap_snapshot()")
    log(f"   gsnap+snap: initial full capture (not timed in the runs) in {time.time() - t:.1f} s")
    # The first pgbench run after pgbench -i is slower on every configuration (measured
    # 2026-11-27: ~20% on gsnap tables without snapshots, ~8% on heap), and more so while
    # snapshots are taken; one untimed run per cluster keeps that out of round 0. The
    # snapshot after it takes the warm-up's writes, so round 0's first capture is like the
    # others.
    if a.warmup > 0:
        for name, c in cl.items():
            p = subprocess.run(b.pgbench_cmd(c, a.warmup, []), env=c.env(), capture_output=True,
                               text=True, cwd=b.out)
            if p.returncode != 0:
                raise RuntimeError(f"pgbench failed: {p.stderr}")
            log(f"   {name}: warm-up run of {a.warmup} s (not timed): "
                f"{parse_pgbench(p.stdout).get('tps', 0):.0f} TPS")
        snap_conn.execute("SELECT gsnap_snapshot()")

    def set_interval(secs: int) -> None:
        snap_conn.execute(f"ALTER SYSTEM SET gsnap.snapshot_interval = {secs}")
        snap_conn.execute("SELECT pg_reload_conf()")

    runs = []
    series = []
    # How long each capture held its MVCC snapshot (gsnap_progress), by snapshot id: only the
    # snapshots declared in the timed runs count (the value a run starts with may be the
    # capture after the warm-up, declared with no load and without copies made ahead).
    held_by_snap: dict[int, float] = {}
    worst: list[float] = []  # each capture's worst second as gsnap_progress reports it

    def sample_horizon(c: Cluster, stop: threading.Event, run_worst: list) -> None:
        """Polls gsnap_progress().horizon_held_ms (with the snapshot it belongs to) and
        worst_second; each new value is one capture's (worst_second is published about a
        second after the capture's end, and kept in `run_worst` with its snapshot's id)."""
        last = None
        with c.connect() as conn:
            # (the value when the run starts is the previous run's last capture's, which may
            # have spanned the end of its pgbench)
            last_durable = conn.execute("SELECT last_durable FROM gsnap_progress()").fetchone()[0]
            while not stop.wait(0.25):
                sid, v, w, d = conn.execute(
                    "SELECT snap_id, horizon_held_ms, worst_second, last_durable FROM gsnap_progress()").fetchone()
                if v is not None and v != last:
                    held_by_snap[sid] = v
                    last = v
                if w is not None and d != last_durable:
                    run_worst.append((d, w))
                    last_durable = d

    for r in range(rounds):
        order = configs[r % 3:] + configs[:r % 3]
        for name in order:
            c = cl[name]
            with c.connect() as conn:
                conn.execute("CHECKPOINT")
                before = conn.execute("SELECT count(*) FROM gsnap_snapshots()").fetchone()[0]
            prefix = str(b.out / f"pgbench_tps_{r}_{name}")
            cmd = b.pgbench_cmd(c, secs, ["--log", "--aggregate-interval=1", f"--log-prefix={prefix}"])
            if name == "gsnap+snap":
                set_interval(a.interval)  # the first periodic snapshot comes `interval` s into the run
            wpid = None
            if name != "heap":
                with c.connect() as conn:
                    wpid = worker_pid(conn)
            wcpu0 = cpu_ms(wpid) if wpid else 0.0
            t0 = time.time()
            cpu0 = cluster_cpu_ms(c)
            stop = threading.Event()
            run_worst: list[tuple[int, float]] = []
            sampler = threading.Thread(target=sample_horizon, args=(c, stop, run_worst))
            threads_cpu = ThreadCpu(wpid) if name == "gsnap+snap" else None
            if name == "gsnap+snap":
                sampler.start()
                threads_cpu.start()
            p = subprocess.run(cmd, env=c.env(), capture_output=True, text=True, cwd=b.out)
            if p.returncode != 0:
                raise RuntimeError(f"pgbench failed: {p.stderr}")
            if name == "gsnap+snap":
                stop.set()
                sampler.join()
                set_interval(0)
                wait_idle(snap_conn)  # no capture left running into the next configuration's run
            res = parse_pgbench(p.stdout)
            if threads_cpu is not None:
                res["worker_threads_cpu_s"] = threads_cpu.stop()
            # (for gsnap+snap this includes the captures that finished after pgbench)
            res["server_cpu_s"] = round((cluster_cpu_ms(c) - cpu0) / 1000, 2)
            res["cpu_us_per_xact"] = round(res["server_cpu_s"] * 1e6 / max(res.get("xacts", 1), 1), 1)
            res["worker_cpu_s"] = round((cpu_ms(wpid) - wcpu0) / 1000, 2) if wpid else 0.0
            res["worker_cpu_share"] = round(res["worker_cpu_s"] / max(res["server_cpu_s"], 1e-3), 4)
            agg = read_aggregate_logs(prefix)
            with c.connect() as conn:
                snaps = conn.execute(
                    "SELECT snap_id, extract(epoch from taken_at)::float8, pages_captured, bytes_stored, state "
                    "FROM gsnap_snapshots() ORDER BY snap_id OFFSET %s", (before,)).fetchall()
            for (sid, at, pages, nbytes, state) in snaps:
                series.append({"round": r, "config": name, "kind": "snapshot", "t": round(at - t0, 3),
                               "second": int(at) - int(t0), "snap_id": sid, "pages": pages, "bytes": nbytes, "state": state})
            # A snapshot declared as pgbench stops has the quiet after the run in its capture:
            # its worst second says nothing about the capture (0 when no write followed).
            declared = {sid: at - t0 for (sid, at, *_rest) in snaps}
            worst.extend(w for (sid, w) in run_worst if declared.get(sid, secs) < secs - 1)
            for sec in sorted(agg):
                x, lsum, lmax = agg[sec]
                series.append({"round": r, "config": name, "kind": "second", "t": sec - int(t0),
                               "tps": x, "lat_avg_ms": round(lsum / max(x, 1) / 1000, 3),
                               "lat_max_ms": round(lmax / 1000, 3)})
            per_sec = [agg[s][0] for s in sorted(agg)][1:-1]  # drop the partial first and last second
            row = {"round": r, "config": name, **res, "snapshots": len(snaps),
                   "snap_pages_median": int(statistics.median([s[2] for s in snaps])) if snaps else 0,
                   "tps_sec_min": min(per_sec) if per_sec else 0,
                   "tps_sec_p5": round(pct(per_sec, 5), 1) if per_sec else 0}
            runs.append(row)
            log(f"   round {r} {name:11s} tps {res.get('tps', 0):9.1f}  lat {res.get('lat_avg_ms', 0):6.3f} ms"
                f"  server CPU {res['cpu_us_per_xact']:6.1f} us/xact (worker {100 * res['worker_cpu_share']:.1f}%)"
                f"  snapshots {len(snaps)}  slowest second {row['tps_sec_min']}")
            if "worker_threads_cpu_s" in res:
                log(f"      worker CPU by thread (s): {res['worker_threads_cpu_s']}")
    bloat = {}
    for name, c in cl.items():
        with c.connect() as conn:
            bloat[name] = {r[0]: {"pages": r[1], "hot_update_pct": float(r[2])} for r in conn.execute(
                "SELECT relname, pg_relation_size(relid) / 8192, "
                "round(100.0 * n_tup_hot_upd / greatest(n_tup_upd, 1), 2) FROM pg_stat_user_tables "
                "WHERE relname IN ('pgbench_branches', 'pgbench_tellers', 'pgbench_accounts')").fetchall()}
    snap_stats = snap_conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE state = 'committed'), sum(pages_captured), sum(bytes_stored) "
        "FROM gsnap_snapshots()").fetchone()
    snap_conn.close()
    write_csv(b.out / "tps.csv", runs)
    write_csv(b.out / "tps_series.csv", series)

    tps = {(r["round"], r["config"]): r["tps"] for r in runs}
    ratios = {"gsnap": [], "gsnap+snap": []}
    for r in range(rounds):
        for name in ratios:
            ratios[name].append(tps[(r, name)] / tps[(r, "heap")])
    med = {name: statistics.median([tps[(r, name)] for r in range(rounds)]) for name in configs}
    cpu = {(r["round"], r["config"]): r["cpu_us_per_xact"] for r in runs}
    cpu_ratio = {name: [cpu[(r, name)] / cpu[(r, "heap")] for r in range(rounds)] for name in ("gsnap", "gsnap+snap")}
    cpu_med = {name: statistics.median([cpu[(r, name)] for r in range(rounds)]) for name in configs}
    lat = {name: statistics.median([x["lat_avg_ms"] for x in runs if x["config"] == name]) for name in configs}
    timed = [x["snap_id"] for x in series if x["kind"] == "snapshot" and x["config"] == "gsnap+snap"]
    held_ms = [held_by_snap[sid] for sid in timed if sid in held_by_snap]
    res = {
        "scale": scale, "clients": a.clients, "threads": a.threads, "seconds": secs, "rounds": rounds,
        "interval_s": a.interval, "synchronous_commit": "on" if a.sync_commit else "off",
        "tps_median": med, "latency_avg_ms_median": lat,
        "ratio_gsnap_per_round": [round(x, 4) for x in ratios["gsnap"]],
        "ratio_snap_per_round": [round(x, 4) for x in ratios["gsnap+snap"]],
        "ratio_gsnap_median": round(statistics.median(ratios["gsnap"]), 4),
        "ratio_snap_median": round(statistics.median(ratios["gsnap+snap"]), 4),
        "cpu_us_per_xact_median": cpu_med,
        "cpu_ratio_gsnap_per_round": [round(x, 4) for x in cpu_ratio["gsnap"]],
        "cpu_ratio_snap_per_round": [round(x, 4) for x in cpu_ratio["gsnap+snap"]],
        "cpu_ratio_gsnap_median": round(statistics.median(cpu_ratio["gsnap"]), 4),
        "cpu_ratio_snap_median": round(statistics.median(cpu_ratio["gsnap+snap"]), 4),
        "worker_cpu_share_snap_median": round(statistics.median(
            [x["worker_cpu_share"] for x in runs if x["config"] == "gsnap+snap"]), 4),
        "worker_cpu_share_gsnap_median": round(statistics.median(
            [x["worker_cpu_share"] for x in runs if x["config"] == "gsnap"]), 4),
        "tables_after_runs": bloat,
        "horizon_held_ms": {"captures": len(held_ms),
                            "missed": len(timed) - len(held_ms),
                            "p50": round(pct(held_ms, 50), 1) if held_ms else None,
                            "p95": round(pct(held_ms, 95), 1) if held_ms else None,
                            "max": round(max(held_ms), 1) if held_ms else None,
                            "each": [round(v, 1) for v in held_ms],
                            "target_p95": "<= 200 (issue 8)"},
        "worst_second_gsnap": {"captures": len(worst),
                               "p5": round(pct(worst, 5), 3) if worst else None,
                               "p50": round(pct(worst, 50), 3) if worst else None,
                               "min": round(min(worst), 3) if worst else None},
        "worst_of_3s_after_declaration": worst_after_declarations(series, configs),
        "snapshots_total": snap_stats[0], "snapshots_committed": snap_stats[1],
        "target_gsnap": ">= 0.98", "target_snap": ">= 0.95 (aim 0.97)",
    }
    res["met_gsnap"] = res["ratio_gsnap_median"] >= 0.98
    res["met_snap"] = res["ratio_snap_median"] >= 0.95
    b.summary["tps"] = res
    log(md_table(["config", "median TPS", "median latency (ms)", "TPS ratio to heap (median of rounds)", "per round",
               "server CPU us/xact", "CPU ratio to heap", "per round"],
              [["heap", f"{med['heap']:.0f}", f"{lat['heap']:.3f}", "1", "", f"{cpu_med['heap']:.1f}", "1", ""],
               ["gsnap", f"{med['gsnap']:.0f}", f"{lat['gsnap']:.3f}", f"{res['ratio_gsnap_median']:.3f}",
                ", ".join(f"{x:.3f}" for x in ratios["gsnap"]), f"{cpu_med['gsnap']:.1f}",
                f"{res['cpu_ratio_gsnap_median']:.3f}", ", ".join(f"{x:.3f}" for x in cpu_ratio["gsnap"])],
               ["gsnap + snapshots", f"{med['gsnap+snap']:.0f}", f"{lat['gsnap+snap']:.3f}",
                f"{res['ratio_snap_median']:.3f}", ", ".join(f"{x:.3f}" for x in ratios["gsnap+snap"]),
                f"{cpu_med['gsnap+snap']:.1f}", f"{res['cpu_ratio_snap_median']:.3f}",
                ", ".join(f"{x:.3f}" for x in cpu_ratio["gsnap+snap"])]]))
    log("   after the runs: " + "; ".join(
        f"{name}: branches {bloat[name]['pgbench_branches']['pages']} pages "
        f"({bloat[name]['pgbench_branches']['hot_update_pct']}% HOT), tellers {bloat[name]['pgbench_tellers']['pages']} "
        f"pages ({bloat[name]['pgbench_tellers']['hot_update_pct']}% HOT)" for name in configs))
    h = res["horizon_held_ms"]
    log(f"   MVCC snapshot held per capture (declaration to last page read, gsnap_progress): "
        f"{h['captures']} captures of the timed runs ({h['missed']} not seen), p50 {h['p50']} ms, "
        f"p95 {h['p95']} ms, max {h['max']} ms")
    ws = res["worst_second_gsnap"]
    log(f"   worst second of each capture as gsnap_progress().worst_second reports it (write transactions in "
        f"its worst second over the minute before): {ws['captures']} captures, p50 {ws['p50']}, p5 {ws['p5']}, "
        f"min {ws['min']}")
    wa = res["worst_of_3s_after_declaration"]
    log("   worst of the 3 seconds from each declaration on / the run's median second (pgbench's log; heap and "
        "gsnap at the same seconds of their rounds, the machine's own dips): " + "; ".join(
            f"{name} p50 {v['p50']}, p5 {v['p5']} ({v['n']})" for name, v in wa.items()))
    log(f"   the gsnap worker used {100 * res['worker_cpu_share_snap_median']:.1f}% of the server CPU in the runs "
        f"with snapshots (median), {100 * res['worker_cpu_share_gsnap_median']:.2f}% without")
    for c in list(cl.values()):
        b.drop(c)


def worst_after_declarations(series: list[dict], configs) -> dict:
    """For each declaration of a gsnap+snap round, the lowest of the second it falls in and the two
    after it over the run's median second (pgbench's per-transaction log), and the same statistic at the
    same seconds of the heap and gsnap rounds of that round: what this machine's seconds do with
    no capture at all (the noise floor of the issue's "worst second after a declaration")."""
    out = {}
    for name in configs:
        ratios = []
        for r in sorted({x["round"] for x in series}):
            secs = {x["t"]: x["tps"] for x in series
                    if x["round"] == r and x["config"] == name and x["kind"] == "second"}
            whole = sorted(secs)[1:-1]  # the partial first and last seconds left out
            if not whole:
                continue
            med = statistics.median(secs[t] for t in whole)
            for x in series:
                if x["round"] == r and x["config"] == "gsnap+snap" and x["kind"] == "snapshot":
                    # the second the declaration falls in (mostly after it), and the next two
                    after = [secs[t] for t in range(x["second"], x["second"] + 3) if t in whole]
                    if len(after) == 3 and med > 0:
                        ratios.append(min(after) / med)
        out[name] = {"n": len(ratios), "p50": round(pct(ratios, 50), 3) if ratios else None,
                     "p5": round(pct(ratios, 5), 3) if ratios else None}
    return out


# -- 2. declaration latency ------------------------------------------------------------------


def timed(conn, sql: str) -> tuple[float, float, object]:
    t0 = time.time()
    p0 = time.perf_counter()
    v = conn.execute(sql).fetchone()[0]
    return t0, (time.perf_counter() - p0) * 1000.0, v


def wait_idle(conn, timeout=120.0) -> None:
    """Waits until every declared snapshot is captured."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if conn.execute("SELECT count(*) FROM gsnap_snapshots() WHERE state = 'capturing'").fetchone()[0] == 0:
            return
        time.sleep(0.05)


def bench_declare(b: Bench) -> None:
    a = b.args
    n_idle = 30 if a.quick else 200
    n_durable = 10 if a.quick else 40
    secs = 10 if a.quick else 60
    log(f"== 2. declaration latency (-s {a.scale}; pgbench -c {a.clients} -j {a.threads} for the loaded part)")
    c = b.cluster("declare", a.tps_shared_buffers)
    b.pgbench_init(c, a.scale, gsnap=True)
    conn = c.connect()
    conn.execute("SELECT gsnap_snapshot()")  # the first, full capture
    samples = []

    # idle: declarations with no write in between (empty spans). Interleaved with the same
    # calls on a cluster whose dirty sets are 16x smaller (gsnap.max_dirty_pages = 65536), to
    # show the part of the declaration that is proportional to the dirty-set capacity.
    small = b.cluster("declare-64k", a.tps_shared_buffers, ["gsnap.max_dirty_pages = 65536"])
    b.pgbench_init(small, 1, gsnap=True)
    sconn = small.connect()
    sconn.execute("SELECT gsnap_snapshot()")
    for i in range(n_idle):
        t0, ms, sid = timed(conn, "SELECT gsnap_snapshot(false)")
        samples.append({"phase": "idle", "kind": "declare", "t": t0, "ms": ms, "snap_id": sid})
        time.sleep(0.02)
        t0, ms, sid = timed(sconn, "SELECT gsnap_snapshot(false)")
        samples.append({"phase": "idle", "kind": "declare_64k", "t": t0, "ms": ms, "snap_id": None})
        time.sleep(0.02)
        if i % 10 == 9:
            wait_idle(conn)
            wait_idle(sconn)
    sconn.close()
    b.drop(small)
    wait_idle(conn)
    for i in range(n_durable):
        t0, ms, sid = timed(conn, "SELECT gsnap_snapshot()")
        samples.append({"phase": "idle", "kind": "durable", "t": t0, "ms": ms, "snap_id": sid})
        time.sleep(0.02)

    # idle, in a database with many other relations: 5,000 plain tables (15,000 rows of
    # pg_class with their TOAST tables and indexes). A declaration lists the gsnap tables;
    # the worker keeps that list and reads pg_class again only after a change to it.
    n_other = 500 if a.quick else 5000
    conn.execute("CREATE SCHEMA bench_other")
    for lo in range(0, n_other, 500):
        with conn.transaction():
            for i in range(lo, min(lo + 500, n_other)):
                conn.execute(f"CREATE TABLE bench_other.t{i} (id int PRIMARY KEY, note text)")
    relations = conn.execute("SELECT count(*) FROM pg_class").fetchone()[0]
    for i in range(n_idle // 2):
        t0, ms, sid = timed(conn, "SELECT gsnap_snapshot(false)")
        samples.append({"phase": "idle", "kind": "declare_many", "t": t0, "ms": ms, "snap_id": sid})
        time.sleep(0.02)
        if i % 10 == 9:
            wait_idle(conn)
    for lo in range(0, n_other, 500):
        conn.execute("DROP TABLE " + ", ".join(f"bench_other.t{i}" for i in range(lo, min(lo + 500, n_other))))
    conn.execute("DROP SCHEMA bench_other")
    wait_idle(conn)

    # under load: pgbench with a per-transaction log; first half declarations without wait
    # every 0.5 s, second half with wait (time to durable) every 1 s
    prefix = str(b.out / "pgbench_declare")
    cmd = b.pgbench_cmd(c, secs, ["--log", f"--log-prefix={prefix}"])
    with c.connect() as cc:
        cc.execute("CHECKPOINT")
    p = subprocess.Popen(cmd, env=c.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=b.out)
    start = time.time()
    time.sleep(2)
    # Declarations alternate between the default gsnap.capture_batch_pages (256) and 32: the
    # worker looks at requests between capture batches, so a declaration that arrives during
    # a capture waits for the batch in progress.
    k = 0
    while time.time() < start + secs / 2:
        batch = 256 if k % 2 == 0 else 32
        conn.execute(f"ALTER SYSTEM SET gsnap.capture_batch_pages = {batch}")
        conn.execute("SELECT pg_reload_conf()")
        time.sleep(0.25)
        t0, ms, sid = timed(conn, "SELECT gsnap_snapshot(false)")
        samples.append({"phase": "load", "kind": "declare" if batch == 256 else "declare_b32", "t": t0, "ms": ms,
                        "snap_id": sid})
        time.sleep(0.125)
        # The baseline: the same session's round trip for a query that does nothing, under
        # the same load (the client and the backend both wait for a core).
        t0, ms, _ = timed(conn, "SELECT 1")
        samples.append({"phase": "load", "kind": "select1", "t": t0, "ms": ms, "snap_id": None})
        time.sleep(0.125)
        k += 1
    conn.execute("ALTER SYSTEM RESET gsnap.capture_batch_pages")
    conn.execute("SELECT pg_reload_conf()")
    while time.time() < start + secs - 2:
        t0, ms, sid = timed(conn, "SELECT gsnap_snapshot()")
        samples.append({"phase": "load", "kind": "durable", "t": t0, "ms": ms, "snap_id": sid})
        time.sleep(1.0)
    out, err = p.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"pgbench failed: {err}")
    res_pgb = parse_pgbench(out)
    xacts = read_xact_logs(prefix)
    wait_idle(conn)
    snaps = {r[0]: r[1:] for r in conn.execute(
        "SELECT snap_id, pages_captured, state FROM gsnap_snapshots()").fetchall()}
    for s in samples:
        s["pages_captured"], s["state"] = snaps.get(s["snap_id"], (None, None))
    conn.close()

    # What the pgbench backends wait for, sampled from pg_stat_activity every few ms, in
    # alternating windows without and with declarations (every 0.25 s, each followed by
    # its capture): a declaration must add no wait of its own.
    win = 4 if a.quick else 8
    p = subprocess.Popen(b.pgbench_cmd(c, 4 * win + 4, []), env=c.env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    time.sleep(2)
    waits: dict[str, dict] = {}
    dconn, qconn = c.connect(), c.connect()
    for label in ("without declarations", "with declarations", "without declarations", "with declarations"):
        cnt: dict[str, int] = {}
        n = 0
        stop_at = time.time() + win
        next_decl = time.time()
        pending: list[threading.Thread] = []
        while time.time() < stop_at:
            if label == "with declarations" and time.time() >= next_decl and not any(t.is_alive() for t in pending):
                t = threading.Thread(target=lambda: dconn.execute("SELECT gsnap_snapshot(false)"))
                t.start()
                pending.append(t)
                next_decl = time.time() + 0.25
            for (wt, we) in qconn.execute(
                    "SELECT coalesce(wait_event_type, 'CPU'), coalesce(wait_event, '-') FROM pg_stat_activity "
                    "WHERE application_name = 'pgbench' AND state = 'active'").fetchall():
                cnt[f"{wt}:{we}"] = cnt.get(f"{wt}:{we}", 0) + 1
                n += 1
            time.sleep(0.003)
        for t in pending:
            t.join()
        w = waits.setdefault(label, {"samples": 0, "counts": {}})
        w["samples"] += n
        for k, v in cnt.items():
            w["counts"][k] = w["counts"].get(k, 0) + v
    p.wait()
    dconn.close()
    qconn.close()
    wait_pct = {label: {k: round(100.0 * v / max(w["samples"], 1), 2)
                        for k, v in sorted(w["counts"].items(), key=lambda kv: -kv[1])}
                for label, w in waits.items()}

    # pgbench latency: transactions running while a declaration was in flight vs the rest
    windows = sorted((s["t"], s["t"] + s["ms"] / 1000.0) for s in samples
                     if s["phase"] == "load" and s["kind"] in ("declare", "declare_b32"))
    overlap, rest = [], []
    j = 0
    for (st, lat) in xacts:
        en = st + lat / 1000.0
        while j < len(windows) and windows[j][1] < st - 1.0:
            j += 1
        hit = any(ws <= en and st <= we for (ws, we) in windows[j:j + 8])
        (overlap if hit else rest).append(lat)
    half = start + secs / 2
    first_half = [lat for (st, lat) in xacts if start + 2 <= st < half]
    write_csv(b.out / "declare.csv", [{**s, "t": round(s["t"] - start, 4), "ms": round(s["ms"], 3)} for s in samples])
    # pgbench latency in 100 ms bins for the plot
    bins: dict[int, list[float]] = {}
    for (st, lat) in xacts:
        bins.setdefault(int((st - start) * 10), []).append(lat)
    write_csv(b.out / "declare_pgbench.csv",
              [{"t": k / 10, "xacts": len(v), "lat_p50_ms": round(pct(v, 50), 3), "lat_max_ms": round(max(v), 3)}
               for k, v in sorted(bins.items())])

    def stats(vals):
        return {"n": len(vals), "p50": round(pct(vals, 50), 3), "p95": round(pct(vals, 95), 3),
                "p99": round(pct(vals, 99), 3), "max": round(max(vals), 3) if vals else None}

    res = {}
    res["declare_idle_max_dirty_pages_65536_ms"] = stats(
        [s["ms"] for s in samples if s["kind"] == "declare_64k"])
    res["declare_load_capture_batch_pages_32_ms"] = stats(
        [s["ms"] for s in samples if s["kind"] == "declare_b32"])
    res["declare_idle_many_relations_ms"] = stats([s["ms"] for s in samples if s["kind"] == "declare_many"])
    res["many_relations"] = relations
    res["select1_load_ms"] = stats([s["ms"] for s in samples if s["kind"] == "select1"])
    for phase in ("idle", "load"):
        for kind in ("declare", "durable"):
            res[f"{kind}_{phase}_ms"] = stats([s["ms"] for s in samples if s["phase"] == phase and s["kind"] == kind])
    res["pgbench"] = res_pgb
    res["pgbench_latency_overlapping_declaration_ms"] = stats(overlap)
    res["pgbench_latency_other_ms"] = stats(rest)
    res["pgbench_latency_first_half_ms"] = stats(first_half)
    res["pgbench_wait_events_pct"] = wait_pct
    d = res["declare_load_ms"]
    res["target"] = "declaration < 5 ms, writers never wait"
    res["met"] = d["p95"] is not None and d["p95"] < 5.0
    b.summary["declare"] = res
    rows = []
    for phase in ("idle", "load"):
        for kind, label in (("declare", "gsnap_snapshot(false)"), ("durable", "gsnap_snapshot() (durable)")):
            s = res[f"{kind}_{phase}_ms"]
            rows.append([label, phase, s["n"], s["p50"], s["p95"], s["p99"], s["max"]])
    s = res["declare_idle_max_dirty_pages_65536_ms"]
    rows.insert(1, ["gsnap_snapshot(false), gsnap.max_dirty_pages = 65536", "idle", s["n"], s["p50"], s["p95"],
                    s["p99"], s["max"]])
    s = res["declare_idle_many_relations_ms"]
    rows.insert(2, [f"gsnap_snapshot(false), {relations} relations in pg_class", "idle", s["n"], s["p50"],
                    s["p95"], s["p99"], s["max"]])
    s = res["declare_load_capture_batch_pages_32_ms"]
    rows.insert(5, ["gsnap_snapshot(false), gsnap.capture_batch_pages = 32", "load", s["n"], s["p50"], s["p95"],
                    s["p99"], s["max"]])
    s = res["select1_load_ms"]
    rows.insert(6, ["SELECT 1 (baseline: the round trip alone)", "load", s["n"], s["p50"], s["p95"], s["p99"],
                    s["max"]])
    log(md_table(["call", "when", "samples", "p50 ms", "p95 ms", "p99 ms", "max ms"], rows))
    o, r = res["pgbench_latency_overlapping_declaration_ms"], res["pgbench_latency_other_ms"]
    events = []
    for w in wait_pct.values():
        for k in w:
            if k not in events:
                events.append(k)
    log(md_table(["pgbench backends' wait events (% of samples)", *wait_pct.keys()],
              [[e, *[w.get(e, 0.0) for w in wait_pct.values()]] for e in events[:10]]))
    log(md_table(["pgbench transactions", "n", "p50 ms", "p95 ms", "p99 ms", "max ms"],
              [["overlapping a declaration", o["n"], o["p50"], o["p95"], o["p99"], o["max"]],
               ["all others", r["n"], r["p50"], r["p95"], r["p99"], r["max"]]]))
    b.drop(c)


# -- 3. capture throughput and memory --------------------------------------------------------


class RssSampler(threading.Thread):
    """Samples the worker's memory (and the capture progress) every `period` seconds."""

    def __init__(self, cluster: Cluster, pid: int, label: str, period=0.1):
        super().__init__(daemon=True)
        self.cluster, self.pid, self.label, self.period = cluster, pid, label, period
        self.rows: list[dict] = []
        self.stop_flag = threading.Event()

    def run(self):
        t0 = time.time()
        with self.cluster.connect() as conn:
            while not self.stop_flag.is_set():
                st = proc_status(self.pid)
                pr = conn.execute("SELECT phase, snap_id, pages_total, pages_done FROM gsnap_progress()").fetchone()
                self.rows.append({"capture": self.label, "t": round(time.time() - t0, 3),
                                  "rss_anon_kb": st.get("RssAnon", 0), "rss_shmem_kb": st.get("RssShmem", 0),
                                  "rss_file_kb": st.get("RssFile", 0), "vm_rss_kb": st.get("VmRSS", 0),
                                  "vm_hwm_kb": st.get("VmHWM", 0), "phase": pr[0], "snap_id": pr[1],
                                  "pages_total": pr[2], "pages_done": pr[3]})
                time.sleep(self.period)

    def stop(self):
        self.stop_flag.set()
        self.join()


_big: dict = {}


def big_cluster(b: Bench) -> tuple[Cluster, dict]:
    """The cluster of benchmarks 3 and 4: a fresh pgbench database, captured by bench 3."""
    if "c" in _big:
        return _big["c"], _big["info"]
    a = b.args
    log(f"   loading pgbench -s {a.big_scale} into gsnap tables (shared_buffers = {a.big_shared_buffers})")
    c = b.cluster("capture", a.big_shared_buffers, ["max_parallel_workers_per_gather = 2"])
    dt = b.pgbench_init(c, a.big_scale, gsnap=True)
    with c.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        info = dict(zip(["accounts_pages", "total_pages", "accounts_bytes"], conn.execute(
            "SELECT pg_relation_size('pgbench_accounts') / 8192, "
            "(SELECT sum(pg_relation_size(oid)) / 8192 FROM pg_class WHERE relam = "
            " (SELECT oid FROM pg_am WHERE amname = 'gsnap'))::bigint, "
            "pg_relation_size('pgbench_accounts')").fetchone()))
    info["load_s"] = round(dt, 1)
    log(f"   loaded in {dt:.1f} s: pgbench_accounts {info['accounts_pages']} pages "
        f"({info['accounts_bytes'] / 2**20:.0f} MiB), all gsnap tables {info['total_pages']} pages")
    _big.update(c=c, info=info)
    return c, info


def capture_once(b: Bench, c: Cluster, label: str, rss_rows: list) -> dict:
    with c.connect() as conn:
        pid = worker_pid(conn)
        hwm0 = proc_status(pid).get("VmHWM", 0)
        sampler = RssSampler(c, pid, label, period=0.05)
        sampler.start()
        time.sleep(0.3)
        w0 = cpu_ms(pid)
        t0 = time.perf_counter()
        sid = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        secs = time.perf_counter() - t0
        wcpu = cpu_ms(pid) - w0
        time.sleep(0.3)
        sampler.stop()
        for r in sampler.rows:  # progress of an earlier snapshot is not this capture's
            if r["snap_id"] != sid:
                r["pages_done"] = 0
        rss_rows.extend(sampler.rows)
        row = conn.execute("SELECT pages_captured, new_images, bytes_stored, carried_pages, state "
                           "FROM gsnap_snapshots() WHERE snap_id = %s", (sid,)).fetchone()
    pages, new_images, nbytes, carried, state = row
    anon = [r["rss_anon_kb"] for r in sampler.rows]
    res = {"capture": label, "snap_id": sid, "state": state, "seconds": round(secs, 3),
           "pages_captured": pages, "new_images": new_images, "bytes_stored": nbytes, "carried_pages": carried,
           "pages_per_s": round(pages / secs), "worker_cpu_s": round(wcpu / 1000, 2),
           "pages_per_worker_cpu_s": round(pages / max(wcpu / 1000, 1e-3)), "bytes_per_page": round(nbytes / max(pages, 1), 1),
           "bytes_per_new_image": round(nbytes / max(new_images, 1), 1),
           "worker_rss_anon_before_kb": anon[0] if anon else None,
           "worker_rss_anon_peak_kb": max(anon) if anon else None,
           "worker_rss_shmem_peak_kb": max(r["rss_shmem_kb"] for r in sampler.rows) if sampler.rows else None,
           "worker_vm_hwm_before_kb": hwm0,
           "worker_vm_hwm_after_kb": sampler.rows[-1]["vm_hwm_kb"] if sampler.rows else None}
    store = c.data / "gsnap"
    res["store_apparent_bytes"], res["store_allocated_bytes"] = dir_size(store)
    log(f"   {label}: snapshot {sid} {state}: {pages} pages in {secs:.2f} s = {res['pages_per_s']:,} pages/s; "
        f"(worker CPU {wcpu / 1000:.2f} s = {res['pages_per_worker_cpu_s']:,} pages per CPU-second); "
        f"{nbytes / 2**20:.1f} MiB stored = {res['bytes_per_page']:.0f} B/page; worker RssAnon "
        f"{res['worker_rss_anon_before_kb'] / 1024:.0f} -> peak {res['worker_rss_anon_peak_kb'] / 1024:.0f} MiB")
    return res


def bench_capture(b: Bench) -> None:
    a = b.args
    log(f"== 3. capture throughput (pgbench -s {a.big_scale}, warm shared buffers)")
    c, info = big_cluster(b)
    rss_rows: list = []
    results = []
    with c.connect() as conn:
        conn.execute("VACUUM ANALYZE")
        for t in ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"):
            conn.execute("SELECT pg_prewarm(%s)", (t,))
        conn.execute("CHECKPOINT")
        assert conn.execute("SELECT count(*) FROM gsnap_snapshots()").fetchone()[0] == 0
    # a) the first snapshot: every page of every gsnap table
    results.append(capture_once(b, c, "full (first snapshot)", rss_rows))
    # b) after a server restart with 1% of pgbench_accounts' pages changed (one row in each
    #    hundredth page): the first snapshot after a restart visits every block but reads only
    #    those whose page LSN is newer than the last snapshot's (issue 8, point 5)
    with c.connect() as conn:
        conn.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid % 6100 = 7")
        changed = conn.execute("SELECT count(*) FROM pgbench_accounts WHERE aid % 6100 = 7").fetchone()[0]
        conn.execute("CHECKPOINT")
    log(f"   {changed} rows of pgbench_accounts updated (one in each hundredth page), then a restart")
    c.restart()
    with c.connect() as conn:
        worker_pid(conn)
        for t in ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"):
            conn.execute("SELECT pg_prewarm(%s)", (t,))
    results.append(capture_once(b, c, "first after a restart, 1% of pages changed", rss_rows))
    # c) incremental: pages written by pgbench since the last snapshot
    with c.connect() as conn:
        conn.execute("CHECKPOINT")
    p = subprocess.run(b.pgbench_cmd(c, a.incr_seconds, []), env=c.env(), capture_output=True, text=True)
    pg = parse_pgbench(p.stdout)
    with c.connect() as conn:
        dirty = conn.execute("SELECT sum((SELECT count(*) FROM gsnap_written_blocks(oid))) FROM pg_class "
                             "WHERE relam = (SELECT oid FROM pg_am WHERE amname = 'gsnap')").fetchone()[0]
        dirty_acc = conn.execute("SELECT count(*) FROM gsnap_written_blocks('pgbench_accounts')").fetchone()[0]
    log(f"   pgbench {a.incr_seconds} s: {pg.get('xacts')} transactions, {dirty} pages written "
        f"({dirty_acc} of pgbench_accounts)")
    r = capture_once(b, c, f"incremental (after {a.incr_seconds} s of pgbench)", rss_rows)
    r["pgbench_xacts"], r["written_pages"], r["written_accounts_pages"] = pg.get("xacts"), dirty, dirty_acc
    results.append(r)
    # d) the store size on disk: right after the captures (RocksDB's WAL still holds what
    #    its memtables hold), and after a restart once the worker has reopened the store
    #    (recovery flushes the WAL into SST files)
    kinds_live: dict = {}
    app_live, _ = dir_size(c.data / "gsnap", kinds_live)
    c.restart()
    with c.connect() as conn:
        worker_pid(conn)
    time.sleep(2)
    kinds: dict = {}
    app, alloc = dir_size(c.data / "gsnap", kinds)
    write_csv(b.out / "capture.csv", results)
    write_csv(b.out / "capture_rss.csv", rss_rows)
    full = results[0]
    res = {"scale": a.big_scale, "shared_buffers": a.big_shared_buffers, **info,
           "captures": results, "store_apparent_bytes_after_restart": app,
           "store_allocated_bytes_after_restart": alloc,
           "store_files_bytes": kinds, "store_apparent_bytes_before_restart": app_live,
           "store_files_bytes_before_restart": kinds_live,
           "store_over_bytes_stored": round(app / max(sum(r["bytes_stored"] for r in results), 1), 2),
           "full_pages_per_s": full["pages_per_s"], "incremental_pages_per_s": results[2]["pages_per_s"],
           "restart_over_full_seconds": round(results[1]["seconds"] / max(full["seconds"], 1e-9), 3),
           "full_bytes_per_page": full["bytes_per_page"],
           "worker_rss_anon_peak_mb": round(max(r["worker_rss_anon_peak_kb"] for r in results) / 1024, 1),
           "table_mb": round(info["accounts_bytes"] / 2**20, 1),
           "target": ">= 50k pages/s; < 3 KB per captured pgbench_accounts page; bounded worker memory"}
    res["met_rate"] = full["pages_per_s"] >= 50000 and results[2]["pages_per_s"] >= 50000
    res["met_bytes"] = full["bytes_per_page"] < 3072
    b.summary["capture"] = res
    log(md_table(["capture", "pages", "seconds", "pages/s", "pages per worker CPU-s", "bytes stored", "B/page",
               "worker RssAnon peak (MiB)"],
              [[r["capture"], r["pages_captured"], r["seconds"], f"{r['pages_per_s']:,}",
                f"{r['pages_per_worker_cpu_s']:,}",
                f"{r['bytes_stored'] / 2**20:.1f} MiB", r["bytes_per_page"],
                f"{r['worker_rss_anon_peak_kb'] / 1024:.0f}"] for r in results]))
    log(f"   first snapshot after the restart (1% of pages changed) / full capture: "
        f"{res['restart_over_full_seconds']:.3f} of the time (target <= 0.1)")
    log(f"   store directory before the restart: {app_live / 2**20:.1f} MiB "
        f"({', '.join(f'{k} {v / 2**20:.1f} MiB' for k, v in sorted(kinds_live.items()))})")
    log(f"   store directory after restart: {app / 2**20:.1f} MiB apparent ({', '.join(f'{k} {v / 2**20:.1f} MiB' for k, v in sorted(kinds.items()))}), "
        f"{alloc / 2**20:.1f} MiB allocated; {res['store_over_bytes_stored']:.2f}x the bytes_stored of its snapshots; "
        f"tables {info['total_pages'] * 8192 / 2**20:.0f} MiB")


# -- 4. AS OF reads vs live ------------------------------------------------------------------


QUERIES = {
    "count": ("SELECT count(*) FROM {src}", "count(*)"),
    "scan": ("SELECT sum(abalance), max(filler) FROM {src}", "sum(abalance), max(filler)"),
}


def bench_asof(b: Bench) -> None:
    a = b.args
    warm = 2 if a.quick else 5
    log(f"== 4. AS OF reads vs live (pgbench -s {a.big_scale}; cold = first read after a restart, warm = median of {warm})")
    c, info = big_cluster(b)
    with c.connect() as conn:
        v = conn.execute("SELECT max(snap_id) FROM gsnap_snapshots() WHERE state = 'committed'").fetchone()[0]
        if v is None:
            conn.execute("SELECT pg_prewarm('pgbench_accounts')")
            v = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
    # asof: gsnap_asof as planned (a streaming custom scan); asof_fscan: the same function
    # forced onto PostgreSQL's function scan (WITH ORDINALITY keeps it), which materializes
    # every row in a tuplestore first
    srcs = {"live": "pgbench_accounts", "asof": f"gsnap_asof(NULL::pgbench_accounts, {v})",
            "asof_fscan": f"gsnap_asof(NULL::pgbench_accounts, {v}) WITH ORDINALITY"}
    # live reads are sequential scans (count(*) could otherwise use an index-only scan on the
    # primary key, which AS OF has no equivalent of)
    noidx = "SET enable_indexonlyscan = off; SET enable_indexscan = off; SET enable_bitmapscan = off; "
    settings = {"serial": noidx + "SET max_parallel_workers_per_gather = 0",
                "parallel": noidx + "SET max_parallel_workers_per_gather = 2"}
    rows = []

    def run(conn, q, src, mode, phase, i):
        conn.execute(settings[mode])
        sql = QUERIES[q][0].format(src=srcs[src])
        wpid = worker_pid(conn)
        bpid = conn.info.backend_pid
        # (per thread, to the nanosecond: a read's CPU is a few hundred ms, and clock ticks of
        # 10 ms could not resolve a change of 10%)
        w0, b0 = threads_cpu_ms(wpid), threads_cpu_ms(bpid)
        p0 = time.perf_counter()
        val = conn.execute(sql).fetchone()
        ms = (time.perf_counter() - p0) * 1000
        rows.append({"query": q, "source": src, "mode": mode, "phase": phase, "i": i, "ms": round(ms, 2),
                     "backend_cpu_ms": round(threads_cpu_ms(bpid) - b0),
                     "worker_cpu_ms": round(threads_cpu_ms(wpid) - w0),
                     "result": str(val[0])})
        return val

    # cold: restart the server, then each source's first read (the live table from the OS page
    # cache; AS OF with an empty image cache and RocksDB block cache)
    for q in QUERIES:
        for src in ("live", "asof"):
            c.restart()
            with c.connect() as conn:
                run(conn, q, src, "serial", "cold", 0)
    results_equal = True
    with c.connect() as conn:
        for i in range(warm):
            for q in QUERIES:
                got = {}
                for src, mode in (("live", "serial"), ("live", "parallel"), ("asof", "serial"), ("asof", "parallel"),
                                  ("asof_fscan", "serial")):
                    if src == "asof_fscan" and i >= 2:
                        continue  # the slow fallback path: two samples are enough
                    got[src] = run(conn, q, src, mode, "warm", i)
                results_equal &= got["live"] == got["asof"] == got.get("asof_fscan", got["asof"])
                # (the parallel reads' results are the same rows, summed in another order)
        # the plan of the AS OF read (a custom scan when gsnap can stream it)
        conn.execute(settings["serial"])
        plan = conn.execute(f"EXPLAIN (ANALYZE, TIMING ON, FORMAT JSON) {QUERIES['count'][0].format(src=srcs['asof'])}").fetchone()[0]
        scan = plan[0]["Plan"]["Plans"][0]
        breakdown = {"node": scan.get("Custom Plan Provider") or scan["Node Type"],
                     "total_ms": round(plan[0]["Execution Time"], 1),
                     "scan_first_row_ms": round(scan["Actual Startup Time"], 1),
                     "scan_total_ms": round(scan["Actual Total Time"], 1)}
    # the same table partitioned (4 hash partitions of gsnap), live against AS OF, serial and
    # parallel (a Parallel Append of parallel sequential scans against the parallel AS OF
    # scan, whose participants read the partitions one after another)
    with c.connect() as conn:
        conn.execute("DROP TABLE IF EXISTS pgbench_accounts_part")
        conn.execute("CREATE TABLE pgbench_accounts_part (LIKE pgbench_accounts) PARTITION BY HASH (aid)")
        for k in range(4):
            conn.execute(f"CREATE TABLE pgbench_accounts_part_{k} PARTITION OF pgbench_accounts_part "
                         f"FOR VALUES WITH (MODULUS 4, REMAINDER {k}) USING gsnap")
        conn.execute("INSERT INTO pgbench_accounts_part SELECT * FROM pgbench_accounts")
        conn.execute("VACUUM ANALYZE pgbench_accounts_part")
        vp = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        srcs["live_part"] = "pgbench_accounts_part"
        srcs["asof_part"] = f"gsnap_asof(NULL::pgbench_accounts_part, {vp})"
        for i in range(warm):
            for q in QUERIES:
                got = {}
                for src in ("live_part", "asof_part"):
                    for mode in ("serial", "parallel"):
                        got[(src, mode)] = run(conn, q, src, mode, "warm", i)
                results_equal &= got[("live_part", "serial")] == got[("asof_part", "serial")]
        conn.execute("DROP TABLE pgbench_accounts_part")
    # the same AS OF reads with an image cache that holds every page image of the table: what
    # is left is the backend's share (no store reads in the worker)
    big_mb = int(info["accounts_bytes"] * 1.3 / 2**20) + 64
    with c.connect() as conn:
        conn.execute(f"ALTER SYSTEM SET gsnap.image_cache_size = '{big_mb}MB'")
    c.restart()
    with c.connect() as conn:
        for i in range(1 + warm):
            for q in QUERIES:
                run(conn, q, "asof", "serial", "bigcache_fill" if i == 0 else "bigcache", i)
                if i > 0:
                    run(conn, q, "asof", "parallel", "bigcache", i)
        conn.execute("ALTER SYSTEM RESET gsnap.image_cache_size")
    c.restart()
    write_csv(b.out / "asof.csv", rows)

    def med(q, src, mode, phase):
        v = [r["ms"] for r in rows if (r["query"], r["source"], r["mode"], r["phase"]) == (q, src, mode, phase)]
        return statistics.median(v) if v else float("nan")

    res = {"scale": a.big_scale, "snapshot": v, "rows": a.big_scale * 100000, "results_equal": results_equal,
           "breakdown_count_asof": breakdown}
    out_rows = []
    for q in QUERIES:
        lc, ac = med(q, "live", "serial", "cold"), med(q, "asof", "serial", "cold")
        lw, lp, aw = med(q, "live", "serial", "warm"), med(q, "live", "parallel", "warm"), med(q, "asof", "serial", "warm")
        def cpu(src, key, phase="warm"):
            v = [r[key] for r in rows if (r["query"], r["source"], r["mode"], r["phase"]) == (q, src, "serial", phase)]
            return statistics.median(v) if v else None

        bc = med(q, "asof", "serial", "bigcache")
        ap, bp = med(q, "asof", "parallel", "warm"), med(q, "asof", "parallel", "bigcache")
        res[q] = {"asof_warm_parallel_ms": ap, "ratio_parallel": round(ap / lp, 2),
                  "asof_bigcache_parallel_ms": bp, "ratio_parallel_bigcache": round(bp / lp, 2),"asof_fscan_warm_ms": med(q, "asof_fscan", "serial", "warm"),
                  "asof_bigcache_warm_ms": bc, "ratio_bigcache": round(bc / lw, 2),
                  "image_cache_mb_bigcache": big_mb,
                  "asof_warm_backend_cpu_ms": cpu("asof", "backend_cpu_ms"),
                  "asof_warm_worker_cpu_ms": cpu("asof", "worker_cpu_ms"),
                  "live_warm_backend_cpu_ms": cpu("live", "backend_cpu_ms"),
                  "asof_bigcache_backend_cpu_ms": cpu("asof", "backend_cpu_ms", "bigcache"),
                  "asof_bigcache_worker_cpu_ms": cpu("asof", "worker_cpu_ms", "bigcache"),
                  "live_cold_ms": lc, "asof_cold_ms": ac, "ratio_cold": round(ac / lc, 2),
                  "live_warm_serial_ms": lw, "live_warm_parallel_ms": lp, "asof_warm_ms": aw,
                  "ratio_warm": round(aw / lw, 2), "ratio_warm_vs_parallel": round(aw / lp, 2),
                  "asof_ns_per_row": round(aw * 1e6 / (a.big_scale * 100000), 1)}
        part = {f"{src}_{mode}_ms": med(q, src, mode, "warm")
                for src in ("live_part", "asof_part") for mode in ("serial", "parallel")}
        part["ratio_serial"] = round(part["asof_part_serial_ms"] / part["live_part_serial_ms"], 2)
        part["ratio_parallel"] = round(part["asof_part_parallel_ms"] / part["live_part_parallel_ms"], 2)
        res[q]["partitioned"] = part
        fs = med(q, "asof_fscan", "serial", "warm")
        out_rows.append([QUERIES[q][1], f"{lc:.0f}", f"{ac:.0f}", f"{ac / lc:.2f}", f"{lw:.0f}", f"{aw:.0f}",
                         f"{aw / lw:.2f}", f"{lp:.0f}", f"{aw / lp:.2f}", f"{fs:.0f}", f"{fs / lw:.2f}",
                         f"{bc:.0f}", f"{bc / lw:.2f}", f"{ap:.0f}", f"{ap / lp:.2f}", f"{bp:.0f}",
                         f"{bp / lp:.2f}"])
    res["target"] = "asof/live within 2x (aim 1.3x)"
    res["met"] = all(res[q]["ratio_warm"] <= 2.0 and res[q]["ratio_cold"] <= 2.0 for q in QUERIES)
    b.summary["asof"] = res
    log(md_table(["query", "live cold ms", "AS OF cold ms", "ratio cold", "live warm ms (serial)", "AS OF warm ms",
               "ratio warm", "live warm ms (parallel)", "ratio vs parallel", "function-scan AS OF warm ms",
               "its ratio", f"AS OF, {big_mb} MB image cache, ms", "its ratio", "AS OF warm ms (parallel)",
               "ratio to live (parallel)", f"AS OF parallel, {big_mb} MB image cache, ms", "its ratio"], out_rows))
    log(md_table(["query (4 hash partitions)", "live serial ms", "AS OF serial ms", "ratio",
                  "live parallel ms", "AS OF parallel ms", "ratio"],
                 [[QUERIES[q][1]] + [f"{res[q]['partitioned'][k]:.0f}" if k.endswith("ms") else
                                     f"{res[q]['partitioned'][k]:.2f}" for k in
                                     ("live_part_serial_ms", "asof_part_serial_ms", "ratio_serial",
                                      "live_part_parallel_ms", "asof_part_parallel_ms", "ratio_parallel")]
                  for q in QUERIES]))
    log(f"   results equal: {results_equal}; plan of count(*) AS OF: {breakdown}")
    for q in QUERIES:
        r = res[q]
        log(f"   {QUERIES[q][1]}: warm CPU ms: live backend {r['live_warm_backend_cpu_ms']}, AS OF backend "
            f"{r['asof_warm_backend_cpu_ms']} + worker {r['asof_warm_worker_cpu_ms']}; with the big image cache: "
            f"backend {r['asof_bigcache_backend_cpu_ms']} + worker {r['asof_bigcache_worker_cpu_ms']}")


# -- profiles (--profile) --------------------------------------------------------------------

# Symbol -> component, first match wins (substring of the symbol or library name).
COMPONENTS = [
    ("blake3", "BLAKE3 fingerprints (content address on write, check on read)"),
    ("lz4", "LZ4 (de)compression"),
    ("codec::decompress", "LZ4 (de)compression"),
    ("rocksdb", "RocksDB (memtable, WAL, reads)"),
    ("crc32c", "RocksDB (memtable, WAL, reads)"),
    ("capture_page", "page visibility + tuple copy (capture_page)"),
    ("HeapTupleSatisfies", "page visibility + tuple copy (capture_page)"),
    ("XidInMVCCSnapshot", "page visibility + tuple copy (capture_page)"),
    ("TransactionIdDid", "page visibility + tuple copy (capture_page)"),
    ("ViewBuilder", "view encoding"),
    ("view::decode", "view decoding (backend)"),
    ("Decoder", "tuple decoding to datums (backend)"),
    ("heap_deform_tuple", "tuple decoding to datums (backend)"),
    ("slot_deform", "tuple decoding to datums (backend)"),
    ("tuplestore", "tuplestore (materialize mode)"),
    ("heap_form_minimal_tuple", "tuplestore (materialize mode)"),
    ("heap_fill_tuple", "tuplestore (materialize mode)"),
    ("heap_compute_data_size", "tuplestore (materialize mode)"),
    ("BufFile", "tuplestore (materialize mode)"),
    ("GetMemoryChunkSpace", "tuplestore (materialize mode)"),
    ("ExecMaterial", "tuplestore (materialize mode)"),
    ("bpchar", "aggregates (same as live)"),
    ("int4", "aggregates (same as live)"),
    ("advance_aggregates", "aggregates (same as live)"),
    ("ExecAgg", "aggregates (same as live)"),
    ("malloc", "allocator (malloc/free)"),
    ("free", "allocator (malloc/free)"),
    ("calloc", "allocator (malloc/free)"),
    ("unlink_chunk", "allocator (malloc/free)"),
    ("alloc", "allocator (malloc/free)"),
    ("sigsetjmp", "pgrx FFI guards (sigsetjmp, thread check)"),
    ("thread_check", "pgrx FFI guards (sigsetjmp, thread check)"),
    ("memmove", "memcpy/memset"),
    ("memcpy", "memcpy/memset"),
    ("memset", "memcpy/memset"),
    ("memcmp", "RocksDB (memtable, WAL, reads)"),
    ("page_fault", "kernel: page faults (fresh allocations)"),
    ("clear_page", "kernel: page faults (fresh allocations)"),
    ("do_anonymous_page", "kernel: page faults (fresh allocations)"),
    ("copy_folio", "kernel: file writes/reads"),
    ("_copy_to_iter", "kernel: file writes/reads"),
    ("ext4", "kernel: file writes/reads"),
    ("_raw_spin_unlock", "kernel: scheduling, wakeups, syscalls"),
    ("finish_task_switch", "kernel: scheduling, wakeups, syscalls"),
    ("syscall", "kernel: scheduling, wakeups, syscalls"),
    ("schedule", "kernel: scheduling, wakeups, syscalls"),
    ("futex", "kernel: scheduling, wakeups, syscalls"),
    ("epoll", "kernel: scheduling, wakeups, syscalls"),
    ("hash_search", "PostgreSQL buffer lookup / locks"),
    ("LWLock", "PostgreSQL buffer lookup / locks"),
    ("ReadBuffer", "PostgreSQL buffer lookup / locks"),
    ("PinBuffer", "PostgreSQL buffer lookup / locks"),
]


def classify(sym: str) -> str:
    for needle, comp in COMPONENTS:
        if needle in sym:
            return comp
    if "[k]" in sym:
        return "kernel: other"
    return "other"


def perf_record(pids: list[int], data: Path) -> subprocess.Popen:
    return subprocess.Popen(["perf", "record", "-F", "1999", "-g", "-o", str(data), "-p", ",".join(map(str, pids))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def perf_summary(data: Path, names: dict[int, str], title: str, path: Path) -> dict:
    """Writes a per-process, per-component and per-symbol summary of a perf recording."""
    res = perf_report(data, names, lambda dso, sym: classify(f"{dso} {sym}"), title, path)
    log(f"   profile written to {path.name}")
    return res


def profile_asof(b: Bench) -> None:
    """perf profile of one AS OF full scan: the backend and the gsnap worker."""
    c, _ = big_cluster(b)
    data = b.out / "asof_perf.data"
    with c.connect() as conn, c.connect() as q:
        v = conn.execute("SELECT max(snap_id) FROM gsnap_snapshots() WHERE state = 'committed'").fetchone()[0]
        sql = QUERIES["scan"][0].format(src=f"gsnap_asof(NULL::pgbench_accounts, {v})")
        wpid = worker_pid(conn)
        bpid = q.info.backend_pid
        q.execute("SET max_parallel_workers_per_gather = 0")
        q.execute(sql).fetchone()  # warm
        perf = perf_record([bpid, wpid], data)
        time.sleep(0.5)
        t0 = time.perf_counter()
        q.execute(sql).fetchone()
        ms = (time.perf_counter() - t0) * 1000
        perf.send_signal(2)
        perf.wait()
    b.summary.setdefault("profiles", {})["asof"] = perf_summary(
        data, {bpid: "backend", wpid: "worker"},
        f"perf profile of one AS OF scan ({QUERIES['scan'][1]} over pgbench_accounts at snapshot {v}), "
        f"{ms:.0f} ms under perf", b.out / "asof_profile.txt")


def profile_writes(b: Bench) -> None:
    """perf profile of the pgbench backends of a gsnap cluster (no snapshots): the share of
    their CPU spent in gsnap.so is the write path's overhead (recording dirty pages)."""
    a = b.args
    c = b.cluster("profile-writes", a.tps_shared_buffers)
    b.pgbench_init(c, a.scale, gsnap=True)
    secs = 10 if a.quick else 20
    p = subprocess.Popen(b.pgbench_cmd(c, secs, []), env=c.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    time.sleep(2)
    pm = c.postmaster_pid()
    kids = subprocess.run(["pgrep", "-P", str(pm)], capture_output=True, text=True).stdout.split()
    backends = []
    for k in kids:
        try:
            cmd = Path(f"/proc/{k}/cmdline").read_bytes().decode(errors="replace")
        except FileNotFoundError:
            continue
        if "postgres: postgres postgres" in cmd:
            backends.append(int(k))
    data = b.out / "writes_perf.data"
    perf = perf_record(backends, data)
    time.sleep(secs - 5)
    perf.send_signal(2)
    perf.wait()
    p.communicate()
    rep = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym", "--stdio", "-g",
                          "none", "--percent-limit", "0"], capture_output=True, text=True).stdout
    in_gsnap = 0.0
    syms = []
    for line in rep.splitlines():
        f = line.split()
        if len(f) >= 3 and f[0].endswith("%") and not line.startswith("#") and f[1] == "gsnap.so":
            share = float(f[0][:-1])
            in_gsnap += share
            syms.append(f"  {share:6.2f}%  {' '.join(f[2:])[:110]}")
    text = (f"perf profile of {len(backends)} pgbench backends (-c {a.clients}, gsnap tables, no snapshots), "
            f"{secs - 5} s\n\nshare of the backends' samples in gsnap.so (the write path): {in_gsnap:.2f}%\n"
            + "\n".join(syms[:25]) + "\n")
    (b.out / "writes_profile.txt").write_text(text)
    os.remove(data)
    b.summary.setdefault("profiles", {})["writes_gsnap_so_share_pct"] = round(in_gsnap, 2)
    log(f"   pgbench backends on gsnap tables spend {in_gsnap:.2f}% of their CPU samples in gsnap.so "
        f"(writes_profile.txt)")
    b.drop(c)


def snapshot_under_perf(conn, wpid: int, data: Path) -> tuple[float, tuple]:
    """Takes a snapshot (until durable) while perf records the worker into data: the seconds it
    took and the snapshot's (pages_captured, new_images, bytes_stored)."""
    perf = perf_record([wpid], data)
    time.sleep(0.5)
    t0 = time.perf_counter()
    sid = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
    secs = time.perf_counter() - t0
    perf.send_signal(2)
    perf.wait()
    return secs, conn.execute("SELECT pages_captured, new_images, bytes_stored FROM gsnap_snapshots() "
                              "WHERE snap_id = %s", (sid,)).fetchone()


def profile_capture(b: Bench) -> None:
    """perf profiles of the worker during a full capture (a new copy of pgbench_accounts with
    different balances, so nothing is deduplicated) and an incremental one."""
    a = b.args
    c, _ = big_cluster(b)
    with c.connect() as conn:
        conn.execute("SELECT gsnap_snapshot()")  # after a restart this one captures everything again
        conn.execute("DROP TABLE IF EXISTS bench_copy")
        conn.execute("CREATE TABLE bench_copy (LIKE pgbench_accounts) USING gsnap WITH (fillfactor = 100)")
        conn.execute("INSERT INTO bench_copy SELECT aid, bid, abalance + 1, filler FROM pgbench_accounts")
        conn.execute("VACUUM ANALYZE bench_copy")
        # the next snapshot captures bench_copy completely (a new table) and nothing else
        conn.execute("SELECT pg_prewarm('bench_copy')")
        conn.execute("CHECKPOINT")
        wpid = worker_pid(conn)
        data = b.out / "capture_perf.data"
        secs, st = snapshot_under_perf(conn, wpid, data)
    prof = b.summary.setdefault("profiles", {})
    prof["capture_full"] = perf_summary(
        data, {wpid: "worker"},
        f"perf profile of the worker during the full capture of a new table (bench_copy): {st[0]} pages ({st[1]} new images, "
        f"{st[2] / 2**20:.0f} MiB stored) in {secs:.2f} s under perf", b.out / "capture_full_profile.txt")
    subprocess.run(b.pgbench_cmd(c, a.incr_seconds, []), env=c.env(), capture_output=True, text=True)
    with c.connect() as conn:
        secs, st = snapshot_under_perf(conn, wpid, data)
        conn.execute("DROP TABLE bench_copy")
    prof["capture_incremental"] = perf_summary(
        data, {wpid: "worker"},
        f"perf profile of the worker during an incremental capture after {a.incr_seconds} s of pgbench: "
        f"{st[0]} pages ({st[1]} new images) in {secs:.2f} s under perf", b.out / "capture_incremental_profile.txt")


# -- main ------------------------------------------------------------------------------------


def bench_keytps(b: Bench) -> None:
    tps_on_off(b, "keytps", "gsnap.key_maps", "key_maps", "key maps", 5, ">= 0.99 (issue 9)", 0.99)


def bench_deltatps(b: Bench) -> None:
    tps_on_off(b, "deltatps", "gsnap.page_deltas", "page_deltas", "page deltas", 6,
               "as close to 1 as the capture's extra read per changed page allows (no target)", None)


def tps_on_off(b: Bench, part: str, guc: str, field: str, what: str, number: int, target: str,
               threshold: float | None) -> None:
    """pgbench TPS with a snapshot every interval on two clusters, `guc` on in one and off in
    the other, interleaved rounds; results in `<part>.csv` and the summary under `part`."""
    a = b.args
    scale, secs, rounds = a.scale, a.seconds, a.rounds
    log(f"== {number}. pgbench TPS with a snapshot every {a.interval} s: {what} on vs off "
        f"(-s {scale}, -c {a.clients} -j {a.threads}, {secs} s runs, {rounds} interleaved rounds, two clusters)")
    cl = {mode: b.cluster(f"{part}-{mode}", a.tps_shared_buffers, [f"{guc} = {mode}"])
          for mode in ("on", "off")}
    conns = {}
    for mode, c in cl.items():
        b.pgbench_init(c, scale, gsnap=True)
        conns[mode] = c.connect()
        t = time.time()
        conns[mode].execute("SELECT gsnap_snapshot()")
        log(f"   {what} {mode}: first snapshot (every page) in {time.time() - t:.1f} s")
    # The first snapshot wrote a lot (key maps: one entry per row), which RocksDB compacts in
    # the background: the runs measure the steady state after it.
    wpids = {mode: worker_pid(conn) for mode, conn in conns.items()}
    t = time.time()
    for mode in cl:
        last = cpu_ms(wpids[mode])
        while time.time() - t < 600:
            time.sleep(2)
            now = cpu_ms(wpids[mode])
            if now - last < 40:
                break
            last = now
    log(f"   workers idle after {time.time() - t:.0f} s")

    def setting(conn, name: str, value) -> None:
        conn.execute(f"ALTER SYSTEM SET {name} = {value}")
        conn.execute("SELECT pg_reload_conf()")

    runs = []
    for r in range(rounds):
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            c, conn = cl[mode], conns[mode]
            conn.execute("CHECKPOINT")
            w0 = cpu_ms(wpids[mode])
            setting(conn, "gsnap.snapshot_interval", a.interval)
            p = subprocess.run(b.pgbench_cmd(c, secs, []), env=c.env(), capture_output=True, text=True,
                               cwd=b.out)
            if p.returncode != 0:
                raise RuntimeError(f"pgbench failed: {p.stderr}")
            setting(conn, "gsnap.snapshot_interval", 0)
            wait_idle(conn)
            res = parse_pgbench(p.stdout)
            row = {"round": r, field: mode, "tps": res["tps"], "lat_avg_ms": res.get("lat_avg_ms"),
                   "worker_cpu_s": round((cpu_ms(wpids[mode]) - w0) / 1000, 2)}
            runs.append(row)
            log(f"   round {r} {what} {mode:3s}: tps {row['tps']:9.1f}  worker CPU {row['worker_cpu_s']} s")
    stored = {mode: int(conn.execute("SELECT sum(bytes_stored) FROM gsnap_snapshots()").fetchone()[0])
              for mode, conn in conns.items()}
    for conn in conns.values():
        conn.close()
    write_csv(b.out / f"{part}.csv", runs)
    by = {(x["round"], x[field]): x for x in runs}
    ratios = [by[(r, "on")]["tps"] / by[(r, "off")]["tps"] for r in range(rounds)]
    res = {"scale": scale, "seconds": secs, "rounds": rounds, "interval_s": a.interval, "setting": guc,
           "ratio_per_round": [round(x, 4) for x in ratios], "ratio_median": round(statistics.median(ratios), 4),
           "worker_cpu_s_median": {m: statistics.median([x["worker_cpu_s"] for x in runs if x[field] == m])
                                   for m in ("on", "off")},
           "bytes_stored": stored, "target": target}
    if threshold is not None:
        res["met"] = res["ratio_median"] >= threshold
    b.summary[part] = res
    log(f"   TPS {what} on / off: median {res['ratio_median']:.3f} (per round "
        f"{', '.join(f'{x:.3f}' for x in ratios)}); worker CPU per run (s, median): {res['worker_cpu_s_median']}; "
        f"bytes stored on / off: {stored}")
    for c in cl.values():
        b.drop(c)


BENCHMARKS = ["tps", "declare", "capture", "asof", "keytps", "deltatps"]


def main() -> int:
    ap = arg_parser(__doc__, BENCHMARKS, HERE / "results",
                    "small smoke test (about 2 minutes)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--seconds", type=int, help="length of each TPS run")
    ap.add_argument("--scale", type=int, help="pgbench scale of benchmarks 1 and 2")
    ap.add_argument("--big-scale", type=int, help="pgbench scale of benchmarks 3 and 4")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--interval", type=int, default=10, help="gsnap.snapshot_interval of the third TPS config")
    ap.add_argument("--incr-seconds", type=int)
    ap.add_argument("--warmup", type=int, help="untimed pgbench run per TPS cluster before the rounds (s)")
    ap.add_argument("--sync-commit", action="store_true", help="synchronous_commit = on (default off)")
    ap.add_argument("--profile", action="store_true", help="perf profile of an AS OF scan")
    a = ap.parse_args()
    q = a.quick
    a.rounds = a.rounds or (1 if q else 3)
    a.seconds = a.seconds or (10 if q else 60)
    a.scale = a.scale or (5 if q else 30)
    a.big_scale = a.big_scale or (10 if q else 100)
    a.incr_seconds = a.incr_seconds or (5 if q else 30)
    a.warmup = (5 if q else 30) if a.warmup is None else a.warmup
    a.tps_shared_buffers = "512MB" if q else "1GB"
    a.big_shared_buffers = "1GB" if q else "4GB"
    only = set(a.only.split(","))
    b = Bench(a)
    b.keep_earlier(BENCHMARKS, only)
    b.summary["settings"] = {k: v for k, v in vars(a).items() if k not in ("out",)}

    def profiles() -> None:
        if a.profile and shutil.which("perf"):
            log("== profiles (perf)")
            if "tps" in only or "declare" in only:
                profile_writes(b)
            if "asof" in only or "capture" in only:
                profile_asof(b)
                profile_capture(b)

    return b.run([("tps", bench_tps), ("declare", bench_declare), ("capture", bench_capture), ("asof", bench_asof),
                  ("keytps", bench_keytps), ("deltatps", bench_deltatps)], only, profiles)


if __name__ == "__main__":
    sys.exit(main())
