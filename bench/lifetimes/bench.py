#!/usr/bin/env python3
"""Benchmarks of gsnap's lifetimes: retention, deletion, reclamation (see README.md here).

    bench.py [--quick] [--only steady,reclaim,delete] [--out DIR] [--minutes M] ...

1. steady   pgbench with a snapshot every --interval seconds for --minutes, twice on two
            identical clusters run at the same time: with a retention policy (snapshots are
            deleted and reclaimed as they age) and without (every snapshot kept). Per second:
            TPS of each, the store's size on disk and live content, retained snapshots, the
            worker's memory. Figures: TPS ratio policy/keep-all, the worst one-second dip, the
            steady-state size against what the retained snapshots need.
2. reclaim  a store of snapshots taken under pgbench, then every other one deleted: time to
            reclaim them all, bytes and images freed per second against the bytes per second
            the captures wrote, the worker's peak memory, and the time for reclamation to go
            on after a kill -9 of the server in the middle of it.
3. delete   gsnap_delete() latency (one snapshot per call), idle and under pgbench, p50/p95/max.
4. busy     the worker's answers while it is busy with lifetimes, under pgbench: the latency of
            gsnap_snapshots(), gsnap_store_stats(), gsnap_delete() and of declaring a snapshot
            (gsnap_snapshot(wait => false)), first while nothing is reclaimed (baseline), then
            while a batch of deletions is reclaimed, compacted and re-estimated (until 10 s
            after the last is reclaimed); pgbench's median TPS in both phases.
5. logrewrite  the mapping log rewrite at scale, on the store alone (RocksDB, no PostgreSQL:
            `crates/store/examples/log_rewrite.rs`): a log of 10 and 30 million mappings, 3 of
            4 snapshots deleted and reclaimed, then rewritten: mappings kept, the rewrite's
            time, the switch's, and the process's resident memory meanwhile against what the
            rewrite that built the new log in memory needed (~50 bytes a live mapping).

Results: CSV and summary.json under --out, plots by plot.py. Times vary with the machine's
load: the two steady-state clusters run side by side, so both see the same noise.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from common import (PGBIN, ROOT, BenchBase, Cluster, arg_parser, log, md_table,  # noqa: E402
                    pct, worker_pid, write_csv)

GSNAP_AM = {"PGOPTIONS": "-c default_table_access_method=gsnap"}
BENCHMARKS = ["steady", "reclaim", "delete", "busy", "logrewrite"]
PROGRESS = re.compile(r"progress: ([\d.]+) s, ([\d.]+) tps")


def rss_kb(pid: int) -> int:
    """The resident memory of a process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def store_files(c: Cluster) -> dict:
    """Bytes of the store directory by kind of file: RocksDB's table files (sst), its write-ahead
    log (wal) and the rest (manifest, options, RocksDB's own info logs)."""
    out = {"sst": 0, "wal": 0, "other": 0}
    for f in (c.data / "gsnap").iterdir():
        try:
            size = f.stat().st_size
        except FileNotFoundError:  # removed by a compaction meanwhile
            continue
        kind = "sst" if f.suffix == ".sst" else "wal" if f.suffix == ".log" else "other"
        out[kind] += size
    return out


def stats(conn) -> dict:
    cur = conn.execute("SELECT * FROM gsnap_store_stats()")
    return dict(zip([d.name for d in cur.description], cur.fetchone()))


def retained(conn) -> tuple[int, int]:
    """(committed snapshots, deleted or reclaimed ones)."""
    return conn.execute(
        "SELECT count(*) FILTER (WHERE state = 'committed'),"
        " count(*) FILTER (WHERE state IN ('deleted', 'reclaimed')) FROM gsnap_snapshots()").fetchone()


class Pgbench:
    """pgbench for `seconds`, reporting TPS every second (-P 1). Its output goes to files, not
    pipes: a pipe nobody reads fills up after some minutes of progress lines, and pgbench then
    stalls in the middle of a transaction."""

    def __init__(self, c: Cluster, seconds: int, clients: int):
        self.out = tempfile.TemporaryFile(mode="w+")
        self.err = tempfile.TemporaryFile(mode="w+")
        self.p = subprocess.Popen(
            [str(PGBIN / "pgbench"), "-n", "-c", str(clients), "-j", str(clients), "-M", "prepared",
             "-T", str(seconds), "-P", "1"],
            env={**c.env()}, stdout=self.out, stderr=self.err, text=True)

    def running(self) -> bool:
        return self.p.poll() is None

    def finish(self, stop: bool = False) -> str:
        """Waits for pgbench (ends it first with `stop`) and returns its progress output."""
        if stop:
            self.p.terminate()
        self.p.wait()
        self.err.seek(0)
        text = self.err.read()
        self.out.close()
        self.err.close()
        return text


def per_second_tps(stderr: str) -> list[float]:
    return [float(m.group(2)) for m in PROGRESS.finditer(stderr)]


class Bench(BenchBase):
    def cluster(self, name: str, extra: list[str]) -> Cluster:
        conf = ["shared_buffers = 256MB", "max_wal_size = 4GB", "checkpoint_timeout = 30min",
                "synchronous_commit = off", "autovacuum_naptime = 10s", *extra]
        c = self.start_cluster(name, conf)
        c.run("pgbench", "-i", "-q", "-s", str(self.args.scale), env=GSNAP_AM)
        return c


# -- 1. steady state ------------------------------------------------------------------------------


def bench_steady(b: Bench):
    a = b.args
    seconds = int(a.minutes * 60)
    log(f"== 1. steady state: pgbench -c {a.clients} for {seconds} s, a snapshot every {a.interval} s, "
        f"policy '{a.policy}' vs keep-all (side by side)")
    runs = {
        "policy": b.cluster("lt-policy", [f"gsnap.snapshot_interval = {a.interval}",
                                          f"gsnap.retention = '{a.policy}'", "gsnap.reclaim_delay = 5"]),
        "keepall": b.cluster("lt-keepall", [f"gsnap.snapshot_interval = {a.interval}"]),
    }
    conns = {k: c.connect() for k, c in runs.items()}
    pids = {k: worker_pid(conns[k]) for k in runs}
    procs = {k: Pgbench(c, seconds, a.clients) for k, c in runs.items()}
    samples = []
    t0 = time.monotonic()
    while any(p.running() for p in procs.values()):
        t = round(time.monotonic() - t0)
        row = {"t": t}
        for k, conn in conns.items():
            s = stats(conn)
            kept, gone = retained(conn)
            row.update({f"{k}_disk": s["disk_bytes"], f"{k}_content": s["content_bytes"],
                        f"{k}_snapshots": kept, f"{k}_deleted": gone, f"{k}_rss_kb": rss_kb(pids[k])})
            files = store_files(runs[k])
            row.update({f"{k}_{kind}": n for kind, n in files.items()})
        policy = stats(conns["policy"])
        row["policy_reclaimed"] = policy["reclaimed_bytes"]
        row["policy_deleted_bytes"] = policy["deleted_bytes"]
        samples.append(row)
        time.sleep(max(0.0, t + 1 - (time.monotonic() - t0)))
    tps = {}
    for k, p in procs.items():
        tps[k] = per_second_tps(p.finish())
    for i, row in enumerate(samples):
        for k in tps:
            row[f"{k}_tps"] = tps[k][i] if i < len(tps[k]) else None
    write_csv(b.out / "steady.csv", samples)
    n = min(len(tps["policy"]), len(tps["keepall"]))
    warm = slice(min(30, n // 4), n)  # leave out the first seconds (caches warming)
    med = {k: statistics.median(tps[k][warm]) for k in tps}
    worst = {k: min(tps[k][warm]) / med[k] for k in tps}
    last = samples[-1]
    res = {
        "seconds": seconds, "policy": a.policy, "interval_s": a.interval, "tps_median": med,
        "tps_ratio_policy_over_keepall": med["policy"] / med["keepall"], "worst_second_over_median": worst,
        "policy_snapshots_at_end": last["policy_snapshots"], "keepall_snapshots_at_end": last["keepall_snapshots"],
        "policy_deleted": last["policy_deleted"],
        "policy_disk_bytes_at_end": last["policy_disk"], "keepall_disk_bytes_at_end": last["keepall_disk"],
        "policy_disk_over_live_content": last["policy_disk"] / last["policy_content"] if last["policy_content"] else None,
        "policy_worker_rss_kb_max": max(r["policy_rss_kb"] for r in samples),
        "keepall_worker_rss_kb_max": max(r["keepall_rss_kb"] for r in samples),
    }
    # The exact bytes the retained snapshots need (gsnap_verify reads the whole store; the
    # per-second samples are RocksDB's estimates).
    needed = conns["policy"].execute("SELECT content_bytes FROM gsnap_verify()").fetchone()[0]
    disk_now = stats(conns["policy"])["disk_bytes"]
    res["policy_needed_bytes_at_end"] = needed
    res["policy_disk_over_needed"] = disk_now / needed if needed else None
    for conn in conns.values():
        conn.close()
    b.summary["steady"] = res
    log(md_table(["", "policy", "keep-all"], [
        ["median TPS", f"{med['policy']:.0f}", f"{med['keepall']:.0f}"],
        ["worst second / median", f"{worst['policy']:.2f}", f"{worst['keepall']:.2f}"],
        ["snapshots kept at the end", last["policy_snapshots"], last["keepall_snapshots"]],
        ["store on disk at the end (MB)", f"{last['policy_disk'] / 2**20:.1f}", f"{last['keepall_disk'] / 2**20:.1f}"],
        ["worker RSS max (MB)", f"{res['policy_worker_rss_kb_max'] / 1024:.0f}",
         f"{res['keepall_worker_rss_kb_max'] / 1024:.0f}"],
    ]))
    log(f"   TPS policy / keep-all: {res['tps_ratio_policy_over_keepall']:.3f}; policy store on disk / live "
        f"content (estimated): {res['policy_disk_over_live_content'] or float('nan'):.2f}; on disk / what the "
        f"retained snapshots need (gsnap_verify): {res['policy_disk_over_needed'] or float('nan'):.2f}")
    for c in list(runs.values()):
        b.drop(c)


# -- 2. reclamation throughput ----------------------------------------------------------------------


def bench_reclaim(b: Bench):
    a = b.args
    log(f"== 2. reclamation: {a.reclaim_snapshots} snapshots under pgbench, every other one deleted")
    c = b.cluster("lt-reclaim", ["gsnap.reclaim_delay = 3600"])
    conn = c.connect()
    load = Pgbench(c, 10_000, a.clients)
    snaps = []
    t0 = time.monotonic()
    try:
        for _ in range(a.reclaim_snapshots):
            time.sleep(a.reclaim_gap)
            snaps.append(conn.execute("SELECT gsnap_snapshot()").fetchone()[0])
    finally:
        load.finish(stop=True)
    capture_s = time.monotonic() - t0
    written = conn.execute("SELECT sum(bytes_stored)::bigint FROM gsnap_snapshots() WHERE snap_id = ANY(%s)",
                           (snaps,)).fetchone()[0]
    victims = snaps[:-1:2]
    time.sleep(3)  # let the worker compute what each deletion frees (gsnap_snapshots().frees_bytes)
    predicted = conn.execute("SELECT sum(frees_bytes)::bigint FROM gsnap_snapshots() WHERE snap_id = ANY(%s)",
                             (victims,)).fetchone()[0]
    conn.execute("SELECT gsnap_delete(%s::bigint[])", (victims,))
    pid = worker_pid(conn)
    conn.execute("ALTER SYSTEM SET gsnap.reclaim_delay = 0")
    conn.execute("SELECT pg_reload_conf()")
    t1 = time.monotonic()
    peak_rss = rss_kb(pid)
    samples = []
    crashed = False
    before_crash = {"reclaimed_bytes": 0, "reclaimed_images": 0}
    resumed_after = 0.0
    while True:
        s = stats(conn)
        peak_rss = max(peak_rss, rss_kb(pid))
        samples.append({"t": round(time.monotonic() - t1, 2), "reclaimed_bytes": s["reclaimed_bytes"],
                        "deleted_unreclaimed": s["deleted_unreclaimed"], "rss_kb": rss_kb(pid)})
        if s["deleted_unreclaimed"] == 0:
            break
        if not crashed and s["deleted_unreclaimed"] <= len(victims) // 2:
            # kill -9 of the server in the middle: how long until reclamation goes on?
            crashed = True
            before_crash = s  # reclaimed_* count since the worker started: summed over both
            left = s["deleted_unreclaimed"]
            t_crash = time.monotonic()
            conn.close()
            c.crash()
            c.start()
            conn = c.connect()
            pid = worker_pid(conn, 60)
            while stats(conn)["deleted_unreclaimed"] >= left:
                time.sleep(0.05)
            resumed_after = time.monotonic() - t_crash
            continue
        time.sleep(0.05)
    reclaim_s = time.monotonic() - t1 - resumed_after
    after = stats(conn)
    verify = conn.execute("SELECT leaked_images + missing_images FROM gsnap_verify()").fetchone()[0]
    write_csv(b.out / "reclaim.csv", samples)
    # What the reclamation jobs freed, exactly (the content estimates of gsnap_store_stats() follow
    # RocksDB's compactions).
    freed_content = before_crash["reclaimed_bytes"] + after["reclaimed_bytes"]
    freed_images = before_crash["reclaimed_images"] + after["reclaimed_images"]
    res = {
        "snapshots": len(snaps), "deleted": len(victims), "reclaim_s": reclaim_s,
        "bytes_written_by_captures": written, "capture_bytes_per_s": written / capture_s,
        "predicted_frees_bytes": predicted,
        "images_freed": freed_images, "images_per_s": freed_images / reclaim_s,
        "content_bytes_freed": freed_content, "content_bytes_per_s": freed_content / reclaim_s,
        "worker_rss_peak_kb": peak_rss, "resume_after_crash_s": resumed_after if crashed else None,
        "verify_damage": verify,
    }
    res["reclaim_over_capture_rate"] = res["content_bytes_per_s"] / res["capture_bytes_per_s"]
    conn.close()
    b.summary["reclaim"] = res
    log(md_table(["measure", "value"], [
        ["snapshots deleted", f"{len(victims)} of {len(snaps)}"],
        ["what the listing said they free (MB)", f"{(predicted or 0) / 2**20:.1f}"],
        ["content freed (MB)", f"{freed_content / 2**20:.1f}"],
        ["reclaimed in (s, the crash excluded)", f"{reclaim_s:.1f}"],
        ["images freed / s", f"{res['images_per_s']:.0f}"],
        ["content bytes freed / s (MB)", f"{res['content_bytes_per_s'] / 2**20:.1f}"],
        ["captures wrote / s (MB)", f"{res['capture_bytes_per_s'] / 2**20:.2f}"],
        ["reclaim rate / capture rate", f"{res['reclaim_over_capture_rate']:.1f}"],
        ["worker RSS peak (MB)", f"{peak_rss / 1024:.0f}"],
        ["reclamation going on after kill -9 (s)", f"{resumed_after:.1f}"],
        ["verify: leaked + missing", verify],
    ]))
    b.drop(c)


# -- 3. delete latency -----------------------------------------------------------------------------


def bench_delete(b: Bench):
    a = b.args
    log(f"== 3. gsnap_delete latency: {a.deletes} deletions idle, {a.deletes} under pgbench")
    c = b.cluster("lt-delete", ["gsnap.reclaim_delay = 1"])
    conn = c.connect()
    snaps = [conn.execute("SELECT gsnap_snapshot()").fetchone()[0] for _ in range(2 * a.deletes + 1)]
    rows = []
    for phase, ids in (("idle", snaps[:a.deletes]), ("pgbench", snaps[a.deletes:-1])):
        load = Pgbench(c, 10_000, a.clients) if phase == "pgbench" else None
        try:
            for s in ids:
                t = time.perf_counter()
                conn.execute("SELECT gsnap_delete(%s)", (s,))
                rows.append({"phase": phase, "ms": (time.perf_counter() - t) * 1000})
                time.sleep(0.05)
        finally:
            if load is not None:
                load.finish(stop=True)
    write_csv(b.out / "delete.csv", rows)
    res = {}
    for phase in ("idle", "pgbench"):
        ms = [r["ms"] for r in rows if r["phase"] == phase]
        res[phase] = {"n": len(ms), "p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95), "max_ms": max(ms)}
        log(f"   gsnap_delete {phase}: p50 {res[phase]['p50_ms']:.2f} ms, p95 {res[phase]['p95_ms']:.2f} ms, "
            f"max {res[phase]['max_ms']:.2f} ms")
    b.summary["delete"] = res
    conn.close()
    b.drop(c)


# -- 4. the worker's answers while it reclaims ------------------------------------------------------


def probe_round(conn, spare: list[int], heavy: bool) -> list[dict]:
    """One round of probes, each request timed (ms): the listing and the store summary, and
    with `heavy` a declaration and a deletion (of one of `spare`) too."""
    probes = [("listing", "SELECT count(*) FROM gsnap_snapshots()", None),
              ("stats", "SELECT * FROM gsnap_store_stats()", None)]
    if heavy:
        probes.append(("declare", "SELECT gsnap_snapshot(wait => false)", None))
        if spare:
            probes.append(("delete", "SELECT gsnap_delete(%s)", (spare.pop(0),)))
    out = []
    for what, sql, args in probes:
        t = time.perf_counter()
        conn.execute(sql, args).fetchall()
        out.append({"what": what, "ms": (time.perf_counter() - t) * 1000})
    return out


def bench_busy(b: Bench):
    a = b.args
    log(f"== 4. the worker's answers while it reclaims: {a.reclaim_snapshots} snapshots under pgbench, "
        "then half deleted at once")
    c = b.cluster("lt-busy", ["gsnap.reclaim_delay = 3600"])
    conn = c.connect()
    seconds = int(4 * a.reclaim_snapshots * a.reclaim_gap + 120)
    load = Pgbench(c, seconds, a.clients)
    rows = []
    t0 = time.monotonic()
    try:
        snaps = []
        for _ in range(a.reclaim_snapshots):
            time.sleep(a.reclaim_gap)
            snaps.append(conn.execute("SELECT gsnap_snapshot()").fetchone()[0])
        victims, spare = snaps[:-1:2], snaps[1:-1:2]
        # Baseline: the same probes under the same load while nothing is reclaimed (the snapshots
        # probed with gsnap_delete wait for the delay of an hour).
        t_base = time.monotonic()
        base_spare = spare[: len(spare) // 2]
        n = 0
        while time.monotonic() - t_base < 20:
            rows += [{**r, "phase": "baseline", "t": round(time.monotonic() - t0, 2)}
                     for r in probe_round(conn, base_spare, n % 5 == 0)]
            n += 1
            time.sleep(0.2)
        conn.execute("SELECT gsnap_delete(%s::bigint[])", (victims,))
        conn.execute("ALTER SYSTEM SET gsnap.reclaim_delay = 0")
        conn.execute("SELECT pg_reload_conf()")
        t_busy = time.monotonic()
        busy_spare = spare[len(spare) // 2:]
        reclaimed_at = None
        # Until everything is reclaimed, then 10 s more: the compaction and the estimates follow.
        while reclaimed_at is None or time.monotonic() - reclaimed_at < 10:
            rows += [{**r, "phase": "reclaiming", "t": round(time.monotonic() - t0, 2)}
                     for r in probe_round(conn, busy_spare, n % 5 == 0)]
            n += 1
            if reclaimed_at is None and (stats(conn)["deleted_unreclaimed"] == 0
                                         or time.monotonic() - t_busy > 300):
                reclaimed_at = time.monotonic()
            time.sleep(0.2)
        reclaim_s = reclaimed_at - t_busy
        busy_s = time.monotonic() - t_busy
    finally:
        err = load.finish(stop=True)
    tps = per_second_tps(err)
    write_csv(b.out / "busy.csv", rows)
    base_tps = tps[int(t_base - t0):int(t_busy - t0)]
    busy_tps = tps[int(t_busy - t0):int(t_busy - t0 + busy_s) + 1]
    res = {"reclaim_s": reclaim_s, "deleted": len(victims),
           "tps_median_baseline": statistics.median(base_tps) if base_tps else None,
           "tps_median_reclaiming": statistics.median(busy_tps) if busy_tps else None}
    table = []
    for what in ("listing", "stats", "declare", "delete"):
        for phase in ("baseline", "reclaiming"):
            ms = [r["ms"] for r in rows if r["what"] == what and r["phase"] == phase]
            if not ms:
                continue
            res[f"{what}_{phase}"] = {"n": len(ms), "p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95),
                                      "max_ms": max(ms)}
            table.append([what, phase, len(ms), f"{pct(ms, 50):.1f}", f"{pct(ms, 95):.1f}", f"{max(ms):.1f}"])
    if res["tps_median_baseline"] and res["tps_median_reclaiming"]:
        res["tps_reclaiming_over_baseline"] = res["tps_median_reclaiming"] / res["tps_median_baseline"]
    b.summary["busy"] = res
    log(md_table(["request", "phase", "n", "p50 ms", "p95 ms", "max ms"], table))
    log(f"   reclaimed {len(victims)} snapshots in {reclaim_s:.1f} s; pgbench median TPS "
        f"{res['tps_median_baseline'] or 0:.0f} before, {res['tps_median_reclaiming'] or 0:.0f} while reclaiming")
    conn.close()
    b.drop(c)


# -- 5. the mapping log rewrite at scale -------------------------------------------------------------

def bench_logrewrite(b: Bench):
    sizes = [100, 300] if b.args.quick else [1000, 3000]
    log(f"== 5. mapping log rewrite of {', '.join(f'{n * 10_000:,}' for n in sizes)} mappings (store only)")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "gsnap-store", "--example", "log_rewrite"],
                   cwd=ROOT, check=True)
    exe = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "examples" / "log_rewrite"
    res = []
    for n in sizes:
        with tempfile.TemporaryDirectory(dir=b.out) as tmp:
            run = subprocess.run([str(exe), tmp, str(n)], capture_output=True, text=True, check=True)
            r = json.loads(run.stdout.strip().splitlines()[-1])
            samples = (Path(tmp) / "log_rewrite_rss.csv").read_text()
        (b.out / f"logrewrite_{r['mappings_before']}.csv").write_text(samples)
        log(f"   {r['mappings_before']:,} -> {r['mappings_after']:,} mappings: rewrite {r['rewrite_s']:.1f} s, "
            f"switch {r['switch_ms']:.1f} ms, compaction {r['compact_s']:.1f} s; RSS +{r['rss_growth_mb']:.0f} MB "
            f"(the in-memory rewrite: ~{r['in_memory_rewrite_estimate_mb']:.0f} MB); store "
            f"{r['store_mb_before']:.0f} -> {r['store_mb_after']:.0f} MB")
        res.append(r)
    b.summary["logrewrite"] = res


def main() -> int:
    ap = arg_parser(__doc__, BENCHMARKS, HERE / "results", "a smoke run of about a minute")
    ap.add_argument("--minutes", type=float, default=30.0, help="length of the steady-state run")
    ap.add_argument("--interval", type=int, default=5, help="seconds between snapshots (steady)")
    ap.add_argument("--policy", default="within=2m minutely=10 hourly=24",
                    help="the retention policy of the steady-state run")
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--clients", type=int, default=2, help="pgbench clients per cluster")
    ap.add_argument("--reclaim-snapshots", type=int, default=40)
    ap.add_argument("--reclaim-gap", type=float, default=1.0, help="seconds between those snapshots")
    ap.add_argument("--deletes", type=int, default=50)
    a = ap.parse_args()
    if a.quick:
        a.minutes, a.interval, a.scale = min(a.minutes, 1.0), 2, 2
        a.policy = "within=20s minutely=1"
        a.reclaim_snapshots, a.reclaim_gap, a.deletes = 10, 0.3, 10
    b = Bench(a)
    only = set(a.only.split(","))
    b.keep_earlier(BENCHMARKS, only)
    return b.run([("steady", bench_steady), ("reclaim", bench_reclaim), ("delete", bench_delete),
                  ("busy", bench_busy), ("logrewrite", bench_logrewrite)], only)


if __name__ == "__main__":
    sys.exit(main())
