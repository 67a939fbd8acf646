#!/usr/bin/env python3
"""PostgreSQL-level benchmarks of gsnap's snapshot sets (see bench/sets/README.md).

    bench.py [--quick] [--only range,diff] [--out DIR] [--rounds N] [--profile | --no-profile] ...

1. range  gsnap_range() over N snapshots of one index group vs N separate gsnap_asof() scans
          producing the same rows (all rows at all N snapshots), N = 5..40, each snapshot
          after 0.5% of the rows were updated: spread at random (the issue's case) and in one
          contiguous run of ids (few pages change). Also the distinct-image bound: the page
          images the N snapshots have between them over the pages N AS OF scans read.
2. diff   gsnap_diff() of two adjacent snapshots of a large table vs the number of pages
          changed between them (1 page to every page, and 0.5% of the rows at random, once
          more captured without page deltas as the baseline), against one full AS OF scan of
          the same table; the diff's output is checked against the rows updated, and the
          capture's cost of the deltas is measured (worker CPU and bytes, with and without).
3. parallel  gsnap_range (count, per-snapshot aggregate) and gsnap_versions over 10 snapshots
          of a 2M-row table (0.5% of the rows updated at random before each), serial plans
          (max_parallel_workers_per_gather = 0) against parallel ones (2 workers), and one
          AS OF scan both ways for reference; results checked equal.
4. keys   lookups by key through the key map: one row by primary key AS OF snapshots 1 to
          1,000 of a large table (0.5% of a small hot set of rows updated before each
          snapshot, so snapshots differ) against the same lookup live through the primary key
          index; one key's versions over all 1,000 snapshots; the capture's cost with the key
          map (worker CPU per captured page of a table with a key map against the same table
          without a key, interleaved rounds).

Every benchmark prints its figures as it goes and writes CSV/JSON under --out; summary.json
collects the target checks. All times are warm (the median of interleaved rounds after a
first, untimed run); the machine is shared, so alternatives are measured interleaved and
compared as ratios within a round.
"""
from __future__ import annotations

import math
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from common import (BenchBase, Cluster, arg_parser, cpu_ms, log, md_table, perf_report,  # noqa: E402
                    proc_stat, worker_pid, write_csv)

# The row of the benchmark tables: about pgbench_accounts' width (~55 rows per 8 kB page at
# fillfactor 90). fillfactor 90 leaves room on each page, so an update of `v` (not indexed) is
# a HOT update that stays on its page: an updated row changes exactly its own page.
TABLE_DDL = ("CREATE TABLE {name} (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL, pad char(84) NOT NULL) "
             "USING gsnap WITH (fillfactor = 90)")
TABLE_FILL = "INSERT INTO {name} SELECT g, g % 1000, 0, '' FROM generate_series(1, {rows}) g"
BLOCK = "(ctid::text::point)[0]::int"

# -- helpers ---------------------------------------------------------------------------------


def med(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def peak_rss_mib(pid: int) -> float:
    """The peak resident memory of a process (VmHWM), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def image_loads(conn) -> int:
    """Images the worker loaded into the shared image cache so far (from the store)."""
    return conn.execute("SELECT image_loads FROM gsnap_index_stats()").fetchone()[0]


class Timer:
    """Times a block of queries on one connection: wall time, the backend's and the gsnap
    worker's CPU, the backend's minor page faults, and the images loaded from the store."""

    def __init__(self, conn, wpid: int):
        self.conn, self.wpid, self.bpid = conn, wpid, conn.info.backend_pid

    def __enter__(self):
        self.l0 = image_loads(self.conn)
        (self.b0, self.f0), self.w0 = proc_stat(self.bpid), cpu_ms(self.wpid)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.ms = (time.perf_counter() - self.t0) * 1000.0
        b, f = proc_stat(self.bpid)
        self.backend_cpu_ms, self.backend_minflt = b - self.b0, f - self.f0
        self.worker_cpu_ms = cpu_ms(self.wpid) - self.w0
        self.image_loads = image_loads(self.conn) - self.l0
        return False

    def row(self) -> dict:
        return {"ms": round(self.ms, 2), "backend_cpu_ms": round(self.backend_cpu_ms),
                "worker_cpu_ms": round(self.worker_cpu_ms), "backend_minflt": self.backend_minflt,
                "image_loads": self.image_loads}


class Bench(BenchBase):
    def __init__(self, args):
        super().__init__(args)
        self.do_profile = False

    def cluster(self, name: str, extra: list[str]) -> Cluster:
        conf = [f"shared_buffers = {self.args.shared_buffers}",
                "synchronous_commit = off",
                "max_wal_size = 8GB",
                "min_wal_size = 1GB",
                "checkpoint_timeout = 30min",
                # no autovacuum pass in the middle of a measurement (it changes no snapshot
                # view, but it competes for the 2 cores)
                "autovacuum = off",
                *extra]
        return self.start_cluster(f"bench-sets-{name}", conf)

    def finish(self, name: str, res: dict, c: Cluster, conns: list, profile) -> None:
        """The end of a benchmark: its figures into summary.json, its sessions closed, then its
        perf profile (profile(), with --profile) and its cluster dropped."""
        self.summary[name] = res
        self.save()
        for conn in conns:
            conn.close()
        if self.do_profile:
            profile()
        self.drop(c)


def make_table(conn, name: str, rows: int) -> int:
    conn.execute(TABLE_DDL.format(name=name))
    conn.execute(TABLE_FILL.format(name=name, rows=rows))
    conn.execute(f"VACUUM (FREEZE, ANALYZE) {name}")
    return conn.execute(f"SELECT pg_relation_size('{name}') / 8192").fetchone()[0]


def update_rows(conn, name: str, ids: list[int]) -> dict:
    """Updates v = v + 1 of the rows `ids` and returns the pages that changed: the blocks the
    old versions were on and the blocks the new versions went to."""
    before = {r[0] for r in conn.execute(f"SELECT DISTINCT {BLOCK} FROM {name} WHERE id = ANY(%s)", (ids,))}
    after = {r[0] for r in conn.execute(f"UPDATE {name} SET v = v + 1 WHERE id = ANY(%s) RETURNING {BLOCK}", (ids,))}
    nblocks = conn.execute(f"SELECT pg_relation_size('{name}') / 8192").fetchone()[0]
    return {"rows_updated": len(ids), "changed_pages": len(before | after),
            "pages_moved_to": len(after - before), "nblocks": nblocks}


def snapshot(conn) -> int:
    return conn.execute("SELECT gsnap_snapshot()").fetchone()[0]


def set_page_deltas(conn, on: bool) -> None:
    """Sets gsnap.page_deltas for the captures that follow (the worker reloads its settings
    on a signal: a moment later)."""
    if conn.execute("SELECT current_setting('gsnap.page_deltas')").fetchone()[0] == ("on" if on else "off"):
        return
    conn.execute("ALTER SYSTEM " + ("RESET gsnap.page_deltas" if on else "SET gsnap.page_deltas = off"))
    conn.execute("SELECT pg_reload_conf()")
    time.sleep(1.5)


def snapshot_stats(conn, sid: int) -> dict:
    r = conn.execute("SELECT state, pages_captured, new_images FROM gsnap_snapshots() WHERE snap_id = %s",
                     (sid,)).fetchone()
    return {"state": r[0], "pages_captured": r[1], "new_images": r[2]}


# -- 1. gsnap_range vs N AS OF scans ---------------------------------------------------------

# What is timed, per N. `range_*` is one query; `asof_*` is N queries, one per snapshot, whose
# results together are the same as the range query's (checked every round).
RANGE_METHODS = {
    "range_agg": ("SELECT snap_id, count(*), sum((rec).v) FROM gsnap_range(NULL::{t}, {a}, {b}) "
                  "GROUP BY snap_id ORDER BY snap_id", None),
    "asof_agg": (None, "SELECT count(*), sum(v) FROM gsnap_asof(NULL::{t}, {s})"),
    # the same AS OF scans with parallel plans off (methods ending in _serial): on this 2-core
    # machine a parallel AS OF plan is not always faster, so each ratio is given against both
    "asof_agg_serial": (None, "SELECT count(*), sum(v) FROM gsnap_asof(NULL::{t}, {s})"),
    "asof_count_serial": (None, "SELECT count(*) FROM gsnap_asof(NULL::{t}, {s})"),
    "range_count": ("SELECT count(*) FROM gsnap_range(NULL::{t}, {a}, {b})", None),
    "asof_count": (None, "SELECT count(*) FROM gsnap_asof(NULL::{t}, {s})"),
    # one row's history: a condition on rec alone, which the range scan checks once per row
    # version (its "Row Filter") and each AS OF scan once per row
    "range_row": ("SELECT snap_id, (rec).v FROM gsnap_range(NULL::{t}, {a}, {b}) WHERE (rec).id = {id} "
                  "ORDER BY snap_id", None),
    "asof_row": (None, "SELECT v FROM gsnap_asof(NULL::{t}, {s}) WHERE id = {id}"),
    # every distinct row version once (and the snapshot-rows they stand for), and one row's
    # versions
    "versions_count": ("SELECT count(*), sum(last_snap - first_snap + 1) FROM gsnap_versions(NULL::{t}, {a}, {b})",
                       None),
    "versions_row": ("SELECT first_snap, last_snap, (rec).v FROM gsnap_versions(NULL::{t}, {a}, {b}) "
                     "WHERE (rec).id = {id} ORDER BY first_snap", None),
    # range_agg's figures from the versions, with the README's pattern (running sums of +v at a
    # version's first snapshot and -v after its last)
    "versions_agg": ("WITH v AS (SELECT first_snap, last_snap, (rec).v AS x FROM gsnap_versions(NULL::{t}, {a}, {b})),"
                     " ev AS (SELECT first_snap AS at, false AS snap, 1 AS n, x FROM v"
                     " UNION ALL SELECT last_snap + 1, false, -1, -x FROM v"
                     " UNION ALL SELECT snap_id, true, 0, 0 FROM gsnap_snapshots()"
                     " WHERE state = 'committed' AND snap_id BETWEEN {a} AND {b}),"
                     " run AS (SELECT at, snap, sum(n) OVER w AS n, sum(x) OVER w AS total FROM ev"
                     " WINDOW w AS (ORDER BY at, snap))"
                     " SELECT at, n, total FROM run WHERE snap AND n > 0 ORDER BY 1", None),
    # diagnostic: AS OF forced onto PostgreSQL's function scan (WITH ORDINALITY keeps it
    # there), which materializes its rows in a tuplestore like gsnap_range does
    "asof_fscan_count": (None, "SELECT count(*) FROM gsnap_asof(NULL::{t}, {s}) WITH ORDINALITY"),
}
METHOD_LABELS = {
    "range_agg": "gsnap_range, per-snapshot count(*), sum(v)",
    "asof_agg": "N x gsnap_asof, count(*), sum(v)",
    "asof_agg_serial": "N x gsnap_asof, count(*), sum(v), parallel plans off",
    "asof_count_serial": "N x gsnap_asof, count(*), parallel plans off",
    "range_count": "gsnap_range, count(*)",
    "asof_count": "N x gsnap_asof, count(*)",
    "range_row": "gsnap_range, one row's history (WHERE (rec).id = ...)",
    "asof_row": "N x gsnap_asof, WHERE id = ...",
    "asof_fscan_count": "N x gsnap_asof as a function scan (materialized), count(*)",
    "versions_count": "gsnap_versions, count(*)",
    "versions_row": "gsnap_versions, one row's versions (WHERE (rec).id = ...)",
    "versions_agg": "gsnap_versions, per-snapshot count(*), sum(v) by running sums",
}
PATTERNS = {
    "random": "0.5% of the rows at random",
    "clustered": "0.5% of the rows, one run of consecutive ids at a random place",
}


def bench_range(b: Bench) -> None:
    a = b.args
    ns, rows, rounds = a.range_ns, a.range_rows, a.rounds
    nmax = max(ns)
    group_length = max(64, nmax + 8)
    log(f"== 1. gsnap_range over N snapshots vs N AS OF scans ({rows:,} rows per table, N = "
        f"{', '.join(map(str, ns))}, {rounds} rounds, gsnap.group_length = {group_length})")
    extra = [f"gsnap.group_length = {group_length}"]
    if a.image_cache:
        extra.append(f"gsnap.image_cache_size = '{a.image_cache}'")
        log(f"   gsnap.image_cache_size = {a.image_cache}")
    c = b.cluster("range", extra)
    conn = c.connect()
    info: dict = {"rows": rows, "group_length": group_length}
    for t in PATTERNS:
        info[f"{t}_pages"] = make_table(conn, f"r_{t}", rows)
    log(f"   tables r_random, r_clustered: {info['random_pages']} pages each "
        f"({info['random_pages'] * 8192 / 2**20:.0f} MiB), fillfactor 90")
    t0 = time.time()
    base = snapshot(conn)
    log(f"   base snapshot {base}: full capture in {time.time() - t0:.1f} s")
    # nmax snapshots, each after 0.5% of the rows of both tables were updated
    rng = random.Random(20261121)
    per = max(1, rows // 200)
    setup = []
    snaps = []
    t0 = time.time()
    for i in range(nmax):
        changed = {"random": update_rows(conn, "r_random", rng.sample(range(1, rows + 1), per))}
        start = rng.randrange(1, rows - per + 2)
        changed["clustered"] = update_rows(conn, "r_clustered", list(range(start, start + per)))
        sid = snapshot(conn)
        snaps.append(sid)
        st = snapshot_stats(conn, sid)
        for t in PATTERNS:
            setup.append({"table": f"r_{t}", "i": i, "snap_id": sid, **changed[t], **st})
    log(f"   {nmax} snapshots ({snaps[0]}..{snaps[-1]}) in {time.time() - t0:.1f} s; pages changed per snapshot "
        + ", ".join(f"{t}: median {med([s['changed_pages'] for s in setup if s['table'] == f'r_{t}']):.0f}"
                    for t in PATTERNS))
    write_csv(b.out / "range_setup.csv", setup)
    groups = conn.execute("SELECT group_id, state, first_snap, last_snap, snapshots, pages_changed "
                          "FROM gsnap_groups() ORDER BY group_id").fetchall()
    info["groups"] = [dict(zip(["group_id", "state", "first", "last", "snapshots", "pages_changed"], g))
                      for g in groups]
    one_group = any(g[2] <= snaps[0] and g[3] >= snaps[-1] for g in groups)
    info["one_group"] = one_group
    log(f"   index groups: {groups}; snapshots {snaps[0]}..{snaps[-1]} in one group: {one_group}")
    if not one_group:
        log("   WARNING: the range spans more than one index group")

    # the distinct-image bound, per table and N: the images the N snapshots s_1..s_N have
    # between them (every page of s_1, plus the pages changed at s_2..s_N) over the pages N
    # AS OF scans read (the size of each snapshot)
    bound = {}
    for t in PATTERNS:
        rs = [s for s in setup if s["table"] == f"r_{t}"]
        for n in ns:
            distinct = rs[0]["nblocks"] + sum(s["changed_pages"] for s in rs[1:n])
            scanned = sum(s["nblocks"] for s in rs[:n])
            bound[(t, n)] = {"distinct_images": distinct, "pages_scanned": scanned,
                             "bound_ratio": round(distinct / scanned, 4)}

    wpid = worker_pid(conn)
    row_id = rows // 3  # the row whose history range_row / asof_row read
    q = c.connect()  # the measuring session
    timer_conn = q
    samples = []
    mismatches = []

    def run(t: str, n: int, method: str, rnd: int) -> None:
        one, each = RANGE_METHODS[method]
        lo, hi = snaps[0], snaps[n - 1]
        serial = method.endswith("_serial")
        if serial:
            q.execute("SET max_parallel_workers_per_gather = 0")
        with Timer(timer_conn, wpid) as tm:
            if one:
                res = q.execute(one.format(t=f"r_{t}", a=lo, b=hi, id=row_id)).fetchall()
            else:
                res = [q.execute(each.format(t=f"r_{t}", s=s, id=row_id)).fetchone() for s in snaps[:n]]
        if serial:
            q.execute("RESET max_parallel_workers_per_gather")
        samples.append({"pattern": t, "n": n, "method": method, "round": rnd, **tm.row()})
        return res

    def check(t: str, n: int, got: dict, rnd: int) -> None:
        """The range's rows equal the N AS OF scans' rows: per snapshot count and sum, and the
        history of one row."""
        rng_rows = [tuple(r[1:]) for r in got["range_agg"]]
        asof_rows = [tuple(r) for r in got["asof_agg"]]
        ids = [r[0] for r in got["range_agg"]]
        total = got["range_count"][0][0]
        counts = [r[0] for r in got["asof_count"]]
        history = [tuple(r) for r in got["range_row"]]
        ok = ids == snaps[:n] and rng_rows == asof_rows and total == sum(counts) == n * rows \
            and history == [(s, r[0]) for s, r in zip(snaps[:n], got["asof_row"])]
        if "versions_count" in got:
            # the versions stand for every row of every snapshot (the ids are consecutive), and
            # one row's versions expand to its history
            _, expanded = got["versions_count"][0]
            runs = [(s, v) for first, last, v in got["versions_row"] for s in range(first, last + 1)]
            ok = ok and snaps[:n] == list(range(snaps[0], snaps[0] + n)) and expanded == n * rows \
                and runs == history
        for m in ("agg", "count"):
            if f"asof_{m}_serial" in got:
                ok = ok and got[f"asof_{m}_serial"] == got[f"asof_{m}"]
        if "versions_agg" in got:
            ok = ok and [tuple(r) for r in got["versions_agg"]] == [tuple(r) for r in got["range_agg"]]
        if not ok:
            mismatches.append({"pattern": t, "n": n, "round": rnd, "range_ids": ids[:5], "range": rng_rows[:5],
                               "asof": asof_rows[:5], "range_count": total, "asof_counts": counts[:5]})
            log(f"   MISMATCH {t} N={n} round {rnd}: range {rng_rows[:3]} vs AS OF {asof_rows[:3]}, "
                f"count {total} vs {sum(counts)}")

    # a first untimed pass (warms the caches and checks the results), then the rounds
    log(f"   warm-up pass (untimed, N = {nmax}) ...")
    for t in PATTERNS:
        for n in (nmax,):
            got = {m: run(t, n, m, -1) for m in ("range_agg", "asof_agg", "range_count", "asof_count",
                                                 "range_row", "asof_row", "versions_count", "versions_row",
                                                 "versions_agg")}
            check(t, n, got, -1)
    samples.clear()
    methods = list(RANGE_METHODS)
    fscan_rounds = min(rounds, a.fscan_rounds)
    for rnd in range(rounds):
        t0 = time.time()
        order = methods[rnd % len(methods):] + methods[:rnd % len(methods)]
        for t in PATTERNS:
            for n in (ns if rnd % 2 == 0 else ns[::-1]):
                got = {}
                for m in order:
                    if m == "asof_fscan_count" and rnd >= fscan_rounds:
                        continue
                    got[m] = run(t, n, m, rnd)
                check(t, n, got, rnd)
        cur = {(s["pattern"], s["n"], s["method"]): s["ms"] for s in samples if s["round"] == rnd}
        log(f"   round {rnd} ({time.time() - t0:.0f} s): N={nmax} random: range_agg {cur[('random', nmax, 'range_agg')]:.0f} ms"
            f", {nmax} x asof_agg {cur[('random', nmax, 'asof_agg')]:.0f} ms, ratio "
            f"{cur[('random', nmax, 'range_agg')] / cur[('random', nmax, 'asof_agg')]:.2f}")

    # EXPLAIN ANALYZE of the largest range: how long filling the tuplestore takes (the
    # function scan's startup) and how much of it spills to temporary files
    explain = {}
    for t in PATTERNS:
        plan = q.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + RANGE_METHODS["range_count"][0].format(
            t=f"r_{t}", a=snaps[0], b=snaps[nmax - 1])).fetchone()[0][0]
        fs = plan["Plan"]["Plans"][0]
        explain[t] = {"execution_ms": round(plan["Execution Time"], 1),
                      "function_scan_startup_ms": round(fs["Actual Startup Time"], 1),
                      "function_scan_total_ms": round(fs["Actual Total Time"], 1),
                      "rows": fs["Actual Rows"],
                      "temp_written_mib": round(fs.get("Temp Written Blocks", 0) * 8192 / 2**20, 1)}
        plan = q.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + RANGE_METHODS["asof_count"][1].format(
            t=f"r_{t}", s=snaps[nmax - 1])).fetchone()[0][0]
        scan = plan["Plan"]["Plans"][0]
        explain[t]["asof_node"] = scan.get("Custom Plan Provider") or scan["Node Type"]
        explain[t]["asof_execution_ms"] = round(plan["Execution Time"], 1)
        # how the versions were read: whole images, or page deltas (serial: a parallel plan
        # shows the leader's share only)
        q.execute("SET max_parallel_workers_per_gather = 0")
        shown = "\n".join(r[0] for r in q.execute("EXPLAIN ANALYZE " + RANGE_METHODS["versions_count"][0].format(
            t=f"r_{t}", a=snaps[0], b=snaps[nmax - 1])).fetchall())
        q.execute("RESET max_parallel_workers_per_gather")
        m = re.search(r"Pages Read: (\d+) images, (\d+) from deltas", shown)
        explain[t]["versions_pages_read"] = {"images": int(m.group(1)), "deltas": int(m.group(2))} if m else shown
    log(f"   EXPLAIN ANALYZE of count(*) over the {nmax}-snapshot range: {explain}")
    # the backend's peak memory for each query, in a fresh session each
    mem: dict = {}
    for t in PATTERNS:
        mem[t] = {}
        for k in ("range_agg", "asof_agg"):
            with c.connect() as fresh:
                base_rss = peak_rss_mib(fresh.info.backend_pid)
                one, each = RANGE_METHODS[k]
                if one:
                    fresh.execute(one.format(t=f"r_{t}", a=snaps[0], b=snaps[nmax - 1])).fetchall()
                else:
                    for s in snaps[:nmax]:
                        fresh.execute(each.format(t=f"r_{t}", s=s)).fetchone()
                mem[t][k] = round(peak_rss_mib(fresh.info.backend_pid) - base_rss)
    log(f"   backend peak RSS growth (MiB, fresh session, N = {nmax}): {mem}")
    write_csv(b.out / "range.csv", samples)

    # figures: per (pattern, N) the medians, and the ratios per round
    res: dict = {"info": info, "explain_range_count_nmax": explain, "peak_rss_growth_mib_nmax": mem,
                 "results_equal": not mismatches,
                 "mismatches": mismatches[:10], "per_n": {}}
    out_rows = []
    for t in PATTERNS:
        for n in ns:
            def m(method):
                return med([s["ms"] for s in samples if (s["pattern"], s["n"], s["method"]) == (t, n, method)])

            def ratios(num, den):
                v = []
                for rnd in range(rounds):
                    x = {s["method"]: s["ms"] for s in samples if (s["pattern"], s["n"], s["round"]) == (t, n, rnd)}
                    if num in x and den in x:
                        v.append(x[num] / x[den])
                return v

            def cpu(method, key):
                return med([s[key] for s in samples if (s["pattern"], s["n"], s["method"]) == (t, n, method)])

            bd = bound[(t, n)]
            r_agg, r_cnt, r_fs = ratios("range_agg", "asof_agg"), ratios("range_count", "asof_count"), \
                ratios("range_count", "asof_fscan_count")
            r_row = ratios("range_row", "asof_row")
            r_ver = ratios("versions_count", "asof_count")
            r_ver_row = ratios("versions_row", "asof_row")
            r_ver_agg = ratios("versions_agg", "asof_agg")
            r_agg_serial = ratios("range_agg", "asof_agg_serial")
            r_ver_serial = ratios("versions_count", "asof_count_serial")
            e = {"n": n, **bd, **{f"{k}_ms": round(m(k), 1) for k in RANGE_METHODS},
                 "ratio_agg_median": round(med(r_agg), 3), "ratio_agg_per_round": [round(x, 3) for x in r_agg],
                 "ratio_count_median": round(med(r_cnt), 3),
                 "ratio_count_per_round": [round(x, 3) for x in r_cnt],
                 "ratio_range_count_vs_fscan_median": round(med(r_fs), 3),
                 "ratio_row_median": round(med(r_row), 3),
                 "ratio_row_per_round": [round(x, 3) for x in r_row],
                 "ratio_versions_median": round(med(r_ver), 3),
                 "ratio_versions_per_round": [round(x, 3) for x in r_ver],
                 "ratio_versions_row_median": round(med(r_ver_row), 3),
                 "ratio_versions_agg_median": round(med(r_ver_agg), 3),
                 "ratio_agg_vs_serial_median": round(med(r_agg_serial), 3),
                 "ratio_agg_vs_serial_per_round": [round(x, 3) for x in r_agg_serial],
                 "ratio_versions_vs_serial_median": round(med(r_ver_serial), 3),
                 "ratio_versions_vs_serial_per_round": [round(x, 3) for x in r_ver_serial],
                 "bound_ms_agg": round(bd["bound_ratio"] * m("asof_agg"), 1),
                 "range_agg_ns_per_output_row": round(m("range_agg") * 1e6 / (n * rows), 1),
                 "asof_agg_ns_per_output_row": round(m("asof_agg") * 1e6 / (n * rows), 1),
                 **{f"{k}_{w}_cpu_ms": cpu(k, f"{w}_cpu_ms") for k in ("range_agg", "asof_agg")
                    for w in ("backend", "worker")},
                 **{f"{k}_{x}": cpu(k, x) for k in ("range_agg", "asof_agg")
                    for x in ("image_loads", "backend_minflt")}}
            res["per_n"][f"{t}/{n}"] = e
            out_rows.append([t, n, e["distinct_images"], e["pages_scanned"], f"{e['bound_ratio']:.3f}",
                             f"{e['range_agg_ms']:.0f}", f"{e['asof_agg_ms']:.0f}", f"**{e['ratio_agg_median']:.2f}**",
                             f"{e['range_count_ms']:.0f}", f"{e['asof_count_ms']:.0f}", f"{e['ratio_count_median']:.2f}",
                             f"{e['asof_fscan_count_ms']:.0f}", f"{e['ratio_range_count_vs_fscan_median']:.2f}",
                             f"{e['range_row_ms']:.0f}", f"{e['asof_row_ms']:.0f}", f"**{e['ratio_row_median']:.2f}**",
                             f"{e['versions_count_ms']:.0f}", f"**{e['ratio_versions_median']:.3f}**",
                             f"{e['versions_row_ms']:.0f}", f"{e['ratio_versions_row_median']:.2f}",
                             f"{e['versions_agg_ms']:.0f}", f"**{e['ratio_versions_agg_median']:.3f}**"])
    log(md_table(["pattern", "N", "distinct images", "pages N AS OF read", "bound ratio",
                  "range agg ms", "N x AS OF agg ms", "ratio agg", "range count(*) ms", "N x AS OF count(*) ms",
                  "ratio count", "N x function-scan AS OF ms", "range count / function-scan AS OF",
                  "range one row's history ms", "N x AS OF one row ms", "ratio one row",
                  "versions count(*) ms", "ratio versions / N x AS OF count(*)", "one row's versions ms",
                  "ratio one row's versions", "per-snapshot agg from versions ms",
                  "ratio agg from versions / N x AS OF agg"], out_rows))
    cpu_rows = []
    for t in PATTERNS:
        e = res["per_n"][f"{t}/{nmax}"]
        for k in ("range_agg", "asof_agg"):
            cpu_rows.append([t, nmax, METHOD_LABELS[k], f"{e[f'{k}_ms']:.0f}", e[f"{k}_backend_cpu_ms"],
                             e[f"{k}_worker_cpu_ms"], e[f"{k}_image_loads"], e[f"{k}_backend_minflt"],
                             mem[t].get(k, ""), e[f"{k}_ns_per_output_row"]])
    log(md_table(["pattern", "N", "query", "ms", "backend CPU ms", "worker CPU ms", "images loaded from the store",
                  "backend minor page faults", "backend peak RSS MiB (fresh session)", "ns per output row"], cpu_rows))
    e = res["per_n"][f"random/{nmax}"]
    res["target"] = f"random 0.5%, N = {nmax}: range time <= 0.25 x {nmax} AS OF scans (aim: the distinct-image bound)"
    res["target_n"] = nmax
    res["measured_ratio"] = e["ratio_agg_median"]
    res["measured_ratio_count"] = e["ratio_count_median"]
    res["measured_ratio_row"] = e["ratio_row_median"]
    res["met_row"] = e["ratio_row_median"] <= 0.25
    res["bound_ratio"] = e["bound_ratio"]
    res["met"] = e["ratio_agg_median"] <= 0.25 and e["ratio_count_median"] <= 0.25
    res["met_bound"] = e["ratio_agg_median"] <= e["bound_ratio"]
    res["measured_ratio_versions"] = e["ratio_versions_median"]
    res["met_versions"] = e["ratio_versions_median"] <= 1.1 * e["bound_ratio"]
    res["measured_ratio_versions_agg"] = e["ratio_versions_agg_median"]
    res["measured_ratio_agg_vs_serial"] = e["ratio_agg_vs_serial_median"]
    res["measured_ratio_versions_vs_serial"] = e["ratio_versions_vs_serial_median"]
    log(f"   target (N = {nmax}, random 0.5%): range / {nmax} AS OF = {e['ratio_agg_median']:.2f} (agg), "
        f"{e['ratio_count_median']:.2f} (count(*)), {e['ratio_row_median']:.2f} (one row's history); "
        f"target <= 0.25: {'met' if res['met'] else 'MISSED'} (one row's history: "
        f"{'met' if res['met_row'] else 'MISSED'}); "
        f"distinct-image bound {e['bound_ratio']:.3f}; gsnap_versions / {nmax} AS OF count(*) = "
        f"{e['ratio_versions_median']:.3f} (target <= bound + 10% = {1.1 * e['bound_ratio']:.3f}: "
        f"{'met' if res['met_versions'] else 'MISSED'}); against AS OF with parallel plans off: GROUP BY snap_id "
        f"{e['ratio_agg_vs_serial_median']:.3f} ({e['asof_agg_serial_ms']:.0f} ms), gsnap_versions "
        f"{e['ratio_versions_vs_serial_median']:.3f} ({e['asof_count_serial_ms']:.0f} ms); results equal: {not mismatches}")
    b.finish("range", res, c, [q, conn], lambda: profile_range(b, c, snaps))


# -- 2. gsnap_diff vs changed pages ----------------------------------------------------------


def bench_diff(b: Bench) -> None:
    a = b.args
    rows, rounds = a.diff_rows, a.diff_rounds
    log(f"== 2. gsnap_diff of adjacent snapshots vs pages changed ({rows:,} rows, {rounds} rounds)")
    c = b.cluster("diff", [])
    conn = c.connect()
    pages = make_table(conn, "d", rows)
    log(f"   table d: {pages} pages ({pages * 8192 / 2**20:.0f} MiB), fillfactor 90")
    t0 = time.time()
    prev = snapshot(conn)
    log(f"   base snapshot {prev}: full capture in {time.time() - t0:.1f} s")
    # one row of every block (ids do not leave their page: the updates are HOT)
    first_id = dict(conn.execute(f"SELECT DISTINCT ON (blk) blk, id FROM (SELECT {BLOCK} AS blk, id FROM d) x "
                                 "ORDER BY blk, id").fetchall())
    blocks = sorted(first_id)
    rng = random.Random(4242)
    cases = []
    for k in a.diff_ks:
        if k < len(blocks):
            cases.append((f"{k} pages", sorted(first_id[blk] for blk in rng.sample(blocks, k))))
    cases.append(("every page", [first_id[blk] for blk in blocks]))
    cases.append(("0.5% rows", sorted(rng.sample(range(1, rows + 1), max(1, rows // 200)))))
    # the target case again, captured without deltas (gsnap.page_deltas = off): the baseline
    cases.append(("0.5% rows, no deltas", sorted(rng.sample(range(1, rows + 1), max(1, rows // 200)))))
    setup = []
    wpid = worker_pid(conn)
    for label, ids in cases:
        deltas = not label.endswith("no deltas")
        set_page_deltas(conn, deltas)
        ch = update_rows(conn, "d", ids)
        with Timer(conn, wpid) as tm:
            sid = snapshot(conn)
        bytes_stored = conn.execute("SELECT bytes_stored FROM gsnap_snapshots() WHERE snap_id = %s",
                                    (sid,)).fetchone()[0]
        setup.append({"case": label, "a": prev, "b": sid, **ch, **snapshot_stats(conn, sid), "ids": ids,
                      "deltas": deltas, "capture_ms": round(tm.ms, 1), "capture_worker_cpu_ms": tm.worker_cpu_ms,
                      "bytes_stored": bytes_stored})
        prev = sid
    set_page_deltas(conn, True)
    write_csv(b.out / "diff_setup.csv", [{k: v for k, v in s.items() if k != "ids"} for s in setup])
    log("   " + "; ".join(f"{s['case']}: {s['changed_pages']} pages ({s['rows_updated']} rows) -> snapshot {s['b']}"
                          for s in setup))

    # correctness: an update of r rows is r 'added' and r 'removed' rows, with the ids
    # updated and v one higher
    checks = []
    for s in setup:
        got = {r[0]: r[1:] for r in conn.execute(
            "SELECT change, count(*), sum((rec).v), array_agg((rec).id ORDER BY (rec).id) "
            f"FROM gsnap_diff(NULL::d, {s['a']}, {s['b']}) GROUP BY change").fetchall()}
        add, rem = got.get("added", (0, 0, [])), got.get("removed", (0, 0, []))
        r = s["rows_updated"]
        ok = (add[0] == rem[0] == r and add[1] - rem[1] == r and list(add[2]) == sorted(s["ids"])
              and list(rem[2]) == sorted(s["ids"]) and set(got) <= {"added", "removed"})
        checks.append({"case": s["case"], "rows_updated": r, "added": add[0], "removed": rem[0],
                       "sum_v_added_minus_removed": (add[1] or 0) - (rem[1] or 0), "ids_match": list(add[2]) ==
                       sorted(s["ids"]), "ok": ok})
        if not ok:
            log(f"   DIFF WRONG for {s['case']} ({s['a']} -> {s['b']}): {checks[-1]}")
    diff_correct = all(x["ok"] for x in checks)
    log(f"   diff output correct in every case (added = removed = rows updated, same ids, v + 1): {diff_correct}")

    q = c.connect()
    samples = []
    diff_sql = "SELECT count(*) FROM gsnap_diff(NULL::d, {a}, {b})"
    asof_sql = "SELECT count(*) FROM gsnap_asof(NULL::d, {b})"
    for s in setup:  # untimed warm-up
        q.execute(diff_sql.format(**s)).fetchone()
        q.execute(asof_sql.format(**s)).fetchone()
    for rnd in range(rounds):
        order = setup[rnd % len(setup):] + setup[:rnd % len(setup)]
        for s in order:
            pair = [("diff", diff_sql), ("asof", asof_sql)]
            for kind, sql in (pair if rnd % 2 == 0 else pair[::-1]):
                with Timer(q, wpid) as tm:
                    n = q.execute(sql.format(**s)).fetchone()[0]
                samples.append({"case": s["case"], "changed_pages": s["changed_pages"], "kind": kind, "round": rnd,
                                "rows_out": n, **tm.row()})
        log(f"   round {rnd}: " + ", ".join(
            f"{x['case']} {x['ms']:.1f}" for x in samples if x["round"] == rnd and x["kind"] == "diff")
            + f" ms; AS OF scan {med([x['ms'] for x in samples if x['round'] == rnd and x['kind'] == 'asof']):.0f} ms")
    write_csv(b.out / "diff.csv", samples)

    # EXPLAIN ANALYZE of each case's diff: how many changed pages were read from deltas
    for s in setup:
        plan = q.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + diff_sql.format(**s)).fetchone()[0][0]
        m = re.match(r"(\d+): (\d+) from deltas", plan["Plan"]["Plans"][0].get("Changed Pages", ""))
        s["pages_from_deltas"] = int(m.group(2)) if m else None
    tgt = next(s for s in setup if s["case"] == "0.5% rows")
    plan = q.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + diff_sql.format(**tgt)).fetchone()[0][0]
    fs = plan["Plan"]["Plans"][0]
    explain = {"execution_ms": round(plan["Execution Time"], 1),
               "diff_node_startup_ms": round(fs["Actual Startup Time"], 1), "rows": fs["Actual Rows"],
               "changed_pages": fs.get("Changed Pages")}

    res: dict = {"rows": rows, "pages": pages, "diff_correct": diff_correct, "checks": checks,
                 "explain_target_case": explain, "cases": {}}
    asof_all = [x["ms"] for x in samples if x["kind"] == "asof"]
    res["asof_scan_ms_median"] = round(med(asof_all), 1)
    asof_round = {r: med([x["ms"] for x in samples if x["kind"] == "asof" and x["round"] == r]) for r in range(rounds)}
    res["asof_scan_ms_per_round"] = [round(asof_round[r], 1) for r in range(rounds)]
    out_rows = []
    for s in setup:
        d = [x for x in samples if x["case"] == s["case"] and x["kind"] == "diff"]
        o = [x for x in samples if x["case"] == s["case"] and x["kind"] == "asof"]
        # per round: the diff over the median AS OF scan of that round (every case's b snapshot
        # has the same size, so all AS OF scans of a round are samples of one cost)
        per_round = [x["ms"] / asof_round[x["round"]] for x in sorted(d, key=lambda z: z["round"])]
        e = {"changed_pages": s["changed_pages"], "rows_updated": s["rows_updated"], "a": s["a"], "b": s["b"],
             "diff_ms": round(med([x["ms"] for x in d]), 2), "asof_ms": round(med([x["ms"] for x in o]), 1),
             "ratio_median": round(med(per_round), 4), "ratio_per_round": [round(x, 4) for x in per_round],
             "diff_backend_cpu_ms": med([x["backend_cpu_ms"] for x in d]),
             "diff_worker_cpu_ms": med([x["worker_cpu_ms"] for x in d]),
             "diff_image_loads": med([x["image_loads"] for x in d]),
             "asof_image_loads": med([x["image_loads"] for x in o]),
             "diff_rows_out": d[0]["rows_out"], "pages_from_deltas": s["pages_from_deltas"],
             "capture_ms": s["capture_ms"], "capture_worker_cpu_ms": s["capture_worker_cpu_ms"],
             "capture_bytes_stored": s["bytes_stored"], "new_images": s["new_images"]}
        e["us_per_changed_page"] = round(e["diff_ms"] * 1000 / max(1, s["changed_pages"]), 1)
        res["cases"][s["case"]] = e
        out_rows.append([s["case"], s["rows_updated"], s["changed_pages"], s["pages_from_deltas"],
                         e["diff_rows_out"], f"{e['diff_ms']:.1f}",
                         e["us_per_changed_page"], f"{e['asof_ms']:.0f}", f"{e['ratio_median']:.3f}",
                         e["diff_backend_cpu_ms"], e["diff_worker_cpu_ms"], e["diff_image_loads"],
                         e["asof_image_loads"]])
    log(md_table(["case", "rows updated", "pages changed", "read from deltas", "diff rows", "diff ms",
                  "us per changed page", "AS OF scan ms", "diff / AS OF", "diff backend CPU ms",
                  "diff worker CPU ms", "diff: images loaded from the store", "AS OF: images loaded"], out_rows))
    # what the deltas cost the capture: the target case captured with and without them
    on, off = res["cases"]["0.5% rows"], res["cases"]["0.5% rows, no deltas"]
    res["capture_with_deltas"] = {
        "pages": on["changed_pages"], "worker_cpu_ms_on": on["capture_worker_cpu_ms"],
        "worker_cpu_ms_off": off["capture_worker_cpu_ms"], "ms_on": on["capture_ms"], "ms_off": off["capture_ms"],
        "bytes_stored_on": on["capture_bytes_stored"], "bytes_stored_off": off["capture_bytes_stored"],
        "us_per_page_on": round(on["capture_worker_cpu_ms"] * 1000 / max(1, on["changed_pages"]), 1),
        "us_per_page_off": round(off["capture_worker_cpu_ms"] * 1000 / max(1, off["changed_pages"]), 1)}
    cw = res["capture_with_deltas"]
    log(f"   capture of the 0.5% case: worker CPU {cw['worker_cpu_ms_on']} ms with deltas, {cw['worker_cpu_ms_off']} ms "
        f"without ({cw['us_per_page_on']} vs {cw['us_per_page_off']} us per changed page); stored "
        f"{cw['bytes_stored_on']:,} vs {cw['bytes_stored_off']:,} bytes")
    # the log-log slope of diff time vs pages changed, from 10 pages up (below, fixed costs)
    pts = [(math.log(e["changed_pages"]), math.log(e["diff_ms"])) for e in res["cases"].values()
           if e["changed_pages"] >= 10]
    if len(pts) >= 2:
        mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
        res["loglog_slope"] = round(sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts), 3)
    e = res["cases"]["0.5% rows"]
    res["target"] = "diff of two adjacent snapshots (0.5% of the rows changed) <= 0.1 x one full AS OF scan"
    res["measured_ratio"] = e["ratio_median"]
    res["met"] = e["ratio_median"] <= 0.1
    res["ratio_without_deltas"] = off["ratio_median"]
    log(f"   target (0.5% rows, {e['changed_pages']} of {pages} pages changed): diff / AS OF = {e['ratio_median']:.3f} "
        f"({e['diff_ms']:.0f} ms vs {e['asof_ms']:.0f} ms); <= 0.1: {'met' if res['met'] else 'MISSED'}; "
        f"log-log slope of diff time vs pages changed (>= 10 pages): {res.get('loglog_slope')}")
    b.finish("diff", res, c, [q, conn], lambda: profile_diff(b, c, tgt))


# -- profiles (perf) -------------------------------------------------------------------------

# (library, symbol) substring -> component, first match wins
COMPONENTS = [
    ("blake3", "fingerprint check of images read (BLAKE3)"),
    ("lz4", "LZ4 decompression"),
    ("rocksdb", "RocksDB reads"),
    ("crc32c", "RocksDB reads"),
    ("BufFile", "tuplestore: temporary files"),
    ("tuplestore", "tuplestore: put/get rows"),
    ("ExecStoreMinimalTuple", "tuplestore: put/get rows"),
    ("minimal_tuple", "tuplestore: put/get rows"),
    ("GetMemoryChunkSpace", "tuplestore: put/get rows"),
    ("heap_form_tuple", "forming a rec datum per output row (heap_form_tuple)"),
    ("heap_fill_tuple", "forming a rec datum per output row (heap_form_tuple)"),
    ("heap_compute_data_size", "forming a rec datum per output row (heap_form_tuple)"),
    ("heap_tuple_set_datum", "forming a rec datum per output row (heap_form_tuple)"),
    ("sets::record", "forming a rec datum per output row (heap_form_tuple)"),
    ("ExecEvalFieldSelect", "executor: (rec).v from the composite (detoast, deform)"),
    ("detoast_attr", "executor: (rec).v from the composite (detoast, deform)"),
    ("DatumGetHeapTupleHeader", "executor: (rec).v from the composite (detoast, deform)"),
    ("heap_deform_tuple", "executor: (rec).v from the composite (detoast, deform)"),
    ("TupleDescGetVersion", "executor: (rec).v from the composite (detoast, deform)"),
    ("lookup_rowtype", "executor: (rec).v from the composite (detoast, deform)"),
    ("record_out", "diff: rows as text (record_out, to_string_lossy)"),
    ("OutputFunctionCall", "diff: rows as text (record_out, to_string_lossy)"),
    ("getTypeOutputInfo", "diff: rows as text (record_out, to_string_lossy)"),
    ("int4out", "diff: rows as text (record_out, to_string_lossy)"),
    ("bpcharout", "diff: rows as text (record_out, to_string_lossy)"),
    ("StringInfo", "diff: rows as text (record_out, to_string_lossy)"),
    ("pg_ltoa", "diff: rows as text (record_out, to_string_lossy)"),
    ("Utf8Chunks", "diff: rows as text (record_out, to_string_lossy)"),
    ("sip::Hasher", "diff: hash maps"),
    ("hash_one", "diff: hash maps"),
    ("hashbrown", "diff: hash maps"),
    ("side_rows", "diff: tuple comparison and row building (side_rows, diff_rows)"),
    ("diff_rows", "diff: tuple comparison and row building (side_rows, diff_rows)"),
    ("memcmp", "memcmp (diff: comparing tuples of changed pages)"),
    ("view::decode", "decoding page views"),
    ("Reader::version", "decoding page views"),
    ("Decoder", "decoding tuples to datums"),
    ("slot_deform", "decoding tuples to datums"),
    ("range_rows", "range: runs and emission loop"),
    ("gsnap_range", "range: runs and emission loop"),
    ("gsnap_core", "index walk (gsnap_core)"),
    ("LookupTupleHashEntry", "executor: aggregates, scan"),
    ("ExecAgg", "executor: aggregates, scan"),
    ("advance_aggregates", "executor: aggregates, scan"),
    ("ExecInterpExpr", "executor: aggregates, scan"),
    ("ExecScan", "executor: aggregates, scan"),
    ("int4_sum", "executor: aggregates, scan"),
    ("int8inc", "executor: aggregates, scan"),
    ("gsnap::api::custom_scan", "AS OF custom scan"),
    ("gsnap::api::scan", "AS OF custom scan"),
    ("sigsetjmp", "pgrx FFI guards"),
    ("thread_check", "pgrx FFI guards"),
    ("pin_images", "image requests to the worker"),
    ("ipc", "image requests to the worker"),
    ("MemoryContextReset", "allocator"),
    ("malloc", "allocator"), ("free", "allocator"), ("palloc", "allocator"), ("pfree", "allocator"),
    ("AllocSet", "allocator"), ("alloc", "allocator"), ("unlink_chunk", "allocator"),
    ("memmove", "memcpy/memset"), ("memcpy", "memcpy/memset"), ("memset", "memcpy/memset"),
    ("copy_folio", "kernel: file writes/reads"),
    ("_copy_to_iter", "kernel: file writes/reads"),
    ("ext4", "kernel: file writes/reads"),
    ("filemap", "kernel: file writes/reads"),
    ("page_fault", "kernel: page faults"), ("clear_page", "kernel: page faults"),
    ("handle_mm_fault", "kernel: page faults"),
]


def classify(dso: str, sym: str) -> str:
    for needle, comp in COMPONENTS:
        if needle in sym:
            return comp
    if any(x in sym for x in ("irqentry_exit", "finish_task_switch", "schedule", "_raw_spin_unlock")):
        return "kernel: interrupts, scheduling (preemption on the shared machine)"
    if "[k]" in sym:
        return "kernel: other"
    if dso == "postgres" and "0x0" in sym:
        return "postgres: unresolved symbols"
    return f"other ({dso})"


def perf_profile(pids: dict[int, str], work, title: str, path: Path) -> dict:
    data = path.with_suffix(".data")
    perf = subprocess.Popen(["perf", "record", "-F", "999", "-o", str(data), "-p", ",".join(map(str, pids))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    t0 = time.perf_counter()
    work()
    secs = time.perf_counter() - t0
    perf.send_signal(2)
    perf.wait()
    res = perf_report(data, pids, classify, f"{title}; {secs:.2f} s under perf", path)
    log(f"   {title}: " + ", ".join(f"{k} {v:.0f}%" for k, v in list(res["by_component"].items())[:6])
        + f" ({path.name})")
    return {"seconds": round(secs, 2), **res}


def profile_range(b: Bench, c: Cluster, snaps: list[int]) -> None:
    n = max(b.args.range_ns)
    prof = b.summary.setdefault("profiles", {})
    with c.connect() as conn, c.connect() as q:
        pids = {q.info.backend_pid: "backend", worker_pid(conn): "worker"}
        sql = RANGE_METHODS["range_agg"][0].format(t="r_random", a=snaps[0], b=snaps[n - 1])
        prof["range"] = perf_profile(pids, lambda: q.execute(sql).fetchall(),
                                     f"perf: gsnap_range over {n} snapshots of r_random (per-snapshot count, sum)",
                                     b.out / "range_profile.txt")
        sql = RANGE_METHODS["versions_row"][0].format(t="r_random", a=snaps[0], b=snaps[n - 1],
                                                      id=b.args.range_rows // 3)
        prof["versions_row"] = perf_profile(pids, lambda: q.execute(sql).fetchall(),
                                            f"perf: one row's versions over {n} snapshots of r_random",
                                            b.out / "versions_row_profile.txt")
        each = RANGE_METHODS["asof_agg"][1]
        prof["asof"] = perf_profile(
            pids, lambda: [q.execute(each.format(t="r_random", s=s)).fetchone() for s in snaps[:n]],
            f"perf: {n} x gsnap_asof of r_random (count, sum)", b.out / "asof_profile.txt")
    b.save()


def profile_diff(b: Bench, c: Cluster, tgt: dict) -> None:
    prof = b.summary.setdefault("profiles", {})
    with c.connect() as conn, c.connect() as q:
        pids = {q.info.backend_pid: "backend", worker_pid(conn): "worker"}
        sql = "SELECT count(*) FROM gsnap_diff(NULL::d, {a}, {b})".format(**tgt)
        prof["diff"] = perf_profile(pids, lambda: [q.execute(sql).fetchone() for _ in range(50)],
                                    f"perf: 50 x gsnap_diff of adjacent snapshots, 0.5% of the rows changed "
                                    f"({tgt['changed_pages']} pages)", b.out / "diff_profile.txt")
    b.save()


# -- main ------------------------------------------------------------------------------------


# -- 3. parallel range and versions scans -------------------------------------------------------

PARALLEL_QUERIES = {
    "range_count": "SELECT count(*) FROM gsnap_range(NULL::{t}, {a}, {b})",
    "range_agg": "SELECT snap_id, count(*), sum((rec).v) FROM gsnap_range(NULL::{t}, {a}, {b}) "
                 "GROUP BY snap_id ORDER BY snap_id",
    "versions_count": "SELECT count(*), sum(last_snap - first_snap + 1) FROM gsnap_versions(NULL::{t}, {a}, {b})",
    "asof_count": "SELECT count(*) FROM gsnap_asof(NULL::{t}, {b})",
}
PARALLEL_MODES = {"serial": "SET max_parallel_workers_per_gather = 0",
                  "parallel": "SET max_parallel_workers_per_gather = 2"}


def bench_parallel(b: Bench) -> None:
    a = b.args
    rows, n, rounds = a.parallel_rows, 10, a.rounds
    log(f"== 3. parallel gsnap_range / gsnap_versions over {n} snapshots of {rows:,} rows, serial vs 2 workers "
        f"({rounds} rounds, interleaved)")
    c = b.cluster("parallel", ["max_parallel_workers_per_gather = 2", "gsnap.image_cache_size = '256MB'"])
    conn = c.connect()
    pages = make_table(conn, "p", rows)
    snaps = [snapshot(conn)]
    rng = random.Random(20261126)
    for _ in range(n - 1):
        update_rows(conn, "p", rng.sample(range(1, rows + 1), max(1, rows // 200)))
        snaps.append(snapshot(conn))
    log(f"   table p: {pages} pages; snapshots {snaps[0]}..{snaps[-1]}")
    wpid = worker_pid(conn)
    samples, results = [], {}
    for rnd in range(rounds + 1):  # round 0 warms the image cache, untimed
        for qname, sql in PARALLEL_QUERIES.items():
            for mode, setting in PARALLEL_MODES.items():
                conn.execute(setting)
                with Timer(conn, wpid) as tm:
                    got = conn.execute(sql.format(t="p", a=snaps[0], b=snaps[-1])).fetchall()
                results.setdefault((qname, mode), got)
                if rnd:
                    samples.append({"query": qname, "mode": mode, "round": rnd, **tm.row()})
    plans = {}
    for qname, sql in PARALLEL_QUERIES.items():
        conn.execute(PARALLEL_MODES["parallel"])
        plan = conn.execute("EXPLAIN (COSTS OFF) " + sql.format(t="p", a=snaps[0], b=snaps[-1])).fetchall()
        plans[qname] = "Parallel Custom Scan" in "\n".join(r[0] for r in plan)
    write_csv(b.out / "parallel.csv", samples)
    res: dict = {"rows": rows, "pages": pages, "snapshots": n, "per_query": {}}
    table = []
    for qname in PARALLEL_QUERIES:
        ser = med([s["ms"] for s in samples if (s["query"], s["mode"]) == (qname, "serial")])
        par = med([s["ms"] for s in samples if (s["query"], s["mode"]) == (qname, "parallel")])
        equal = results[(qname, "serial")] == results[(qname, "parallel")]
        res["per_query"][qname] = {"serial_ms": ser, "parallel_ms": par, "ratio": round(par / ser, 3),
                                   "parallel_plan": plans[qname], "results_equal": equal}
        table.append([qname, f"{ser:.0f}", f"{par:.0f}", f"{par / ser:.2f}", plans[qname], equal])
    log(md_table(["query", "serial ms", "parallel ms (2 workers)", "parallel / serial", "parallel plan",
                  "same result"], table))
    b.finish("parallel", res, c, [conn], lambda: None)


def bench_keys(b: Bench) -> None:
    a = b.args
    rows, nsnaps, rounds = a.keys_rows, a.keys_snaps, a.rounds
    log(f"== 4. lookups by key: {rows:,} rows, {nsnaps} snapshots ({rounds} rounds)")
    # (a range over 1,000 snapshots pins every index group of the range at once: about 2 MB
    # each for this table)
    c = b.cluster("keys", ["gsnap.image_cache_size = '256MB'", "gsnap.index_cache_size = '512MB'",
                           "max_parallel_workers_per_gather = 2"])
    conn = c.connect()
    t0 = time.perf_counter()
    pages = make_table(conn, "k", rows)
    first = snapshot(conn)
    log(f"   table k: {pages} pages; first snapshot (capture of every page, map started) "
        f"{time.perf_counter() - t0:.0f} s after the load began")
    rng = random.Random(20261127)
    hot = rng.sample(range(1, rows + 1), 2000)
    snaps = [first]
    t0 = time.perf_counter()
    for i in range(nsnaps - 1):
        ids = rng.sample(hot, 10)
        conn.execute("UPDATE k SET v = v + 1 WHERE id = ANY(%s)", (ids,))
        snaps.append(conn.execute("SELECT gsnap_snapshot(false)").fetchone()[0])
    conn.execute("SELECT gsnap_snapshot(true)")
    log(f"   {nsnaps} snapshots in {time.perf_counter() - t0:.0f} s")
    # Lookups: keys from the hot set (changed between snapshots) and cold ones, at snapshots
    # from the first to the last; each against the live lookup through the primary key.
    at = sorted({snaps[0], snaps[min(9, nsnaps - 1)], snaps[min(99, nsnaps - 1)], snaps[-1]})
    keys = rng.sample(hot, 5) + rng.sample(range(1, rows + 1), 5)
    samples = []
    for rnd in range(rounds + 1):  # round 0 warms the caches, untimed
        for s in at:
            for k in keys:
                live_sql = f"SELECT * FROM k WHERE id = {k}"
                asof_sql = f"SELECT * FROM gsnap_asof(NULL::k, {s}) WHERE id = {k}"
                t = time.perf_counter()
                live = conn.execute(live_sql).fetchall()
                live_ms = (time.perf_counter() - t) * 1000
                t = time.perf_counter()
                got = conn.execute(asof_sql).fetchall()
                asof_ms = (time.perf_counter() - t) * 1000
                assert len(got) == 1 and got[0][0] == k and (s != snaps[-1] or got == live), (s, k, got, live)
                if rnd:
                    samples.append({"round": rnd, "snap": s, "key": k, "live_ms": round(live_ms, 4),
                                    "asof_ms": round(asof_ms, 4)})
    plan = "\n".join(r[0] for r in conn.execute(
        f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) SELECT * FROM gsnap_asof(NULL::k, {snaps[-1]}) WHERE id = {keys[0]}"))
    assert ", 1 pages read" in plan, plan
    # Server-side execution time of one lookup (no round trip), live and AS OF.
    def exec_ms(sql: str) -> float:
        out = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql).fetchone()[0][0]
        return out["Execution Time"]
    server = {"live": med([exec_ms(f"SELECT * FROM k WHERE id = {k}") for k in keys for _ in range(3)]),
              "asof": med([exec_ms(f"SELECT * FROM gsnap_asof(NULL::k, {snaps[-1]}) WHERE id = {k}")
                           for k in keys for _ in range(3)])}
    # One key's versions over every snapshot, and the same by a full range read.
    hist = []
    for rnd in range(rounds + 1):
        k = hot[rnd % len(hot)]
        t = time.perf_counter()
        got = conn.execute(f"SELECT first_snap, last_snap, (rec).v FROM gsnap_versions(NULL::k, {snaps[0]}, "
                           f"{snaps[-1]}) WHERE (rec).id = {k} ORDER BY 1").fetchall()
        ms = (time.perf_counter() - t) * 1000
        assert got and got[0][0] == snaps[0] and got[-1][1] == snaps[-1], got
        if rnd:
            hist.append({"round": rnd, "key": k, "versions": len(got), "ms": round(ms, 3)})
    # Ranges of keys (`id BETWEEN lo AND lo + w - 1`) at the last snapshot: through the key
    # map (the keys between the bounds looked up), against the same rows by a full read of
    # the snapshot (`id + 0`, which the map cannot serve) and live through the primary key.
    ranges = []
    widths = [w for w in (1, 10, 100, 1000, 4000, 8000) if w * 3 <= pages]
    for rnd in range(rounds + 1):
        for w in widths:
            lo = rng.randrange(1, rows - w)
            cond = f"BETWEEN {lo} AND {lo + w - 1}"
            timed = {}
            for name, sql in (("live", f"SELECT * FROM k WHERE id {cond}"),
                              ("map", f"SELECT * FROM gsnap_asof(NULL::k, {snaps[-1]}) WHERE id {cond}"),
                              ("full", f"SELECT * FROM gsnap_asof(NULL::k, {snaps[-1]}) WHERE id + 0 {cond}")):
                t = time.perf_counter()
                timed[name] = sorted(conn.execute(sql).fetchall())
                timed[name + "_ms"] = (time.perf_counter() - t) * 1000
            assert timed["map"] == timed["full"] == timed["live"] and len(timed["map"]) == w, (w, lo)
            if rnd:
                ranges.append({"round": rnd, "width": w, "live_ms": round(timed["live_ms"], 3),
                               "map_ms": round(timed["map_ms"], 3), "full_ms": round(timed["full_ms"], 3)})
    plan = "\n".join(r[0] for r in conn.execute(
        f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) SELECT * FROM gsnap_asof(NULL::k, {snaps[-1]}) "
        f"WHERE id BETWEEN 1000 AND {999 + widths[-1]}"))
    assert "Key Lookup: id (range)" in plan and "pages read" in plan, plan
    write_csv(b.out / "keys_lookup.csv", samples)
    write_csv(b.out / "keys_history.csv", hist)
    write_csv(b.out / "keys_ranges.csv", ranges)
    # The capture's cost with the key map: worker CPU per captured page of a table with the
    # map (k, its primary key) against one without (k2: the same rows, a plain index on id
    # instead), the same share of rows updated in each, interleaved rounds.
    conn.execute("CREATE TABLE k2 (id int NOT NULL, k int NOT NULL, v int NOT NULL, pad char(84) NOT NULL) "
                 "USING gsnap WITH (fillfactor = 90)")
    conn.execute("INSERT INTO k2 SELECT * FROM k ORDER BY id")
    conn.execute("CREATE INDEX ON k2 (id)")
    conn.execute("VACUUM (FREEZE, ANALYZE) k2")
    snapshot(conn)
    wpid = worker_pid(conn)
    # Starting the map of k wrote one entry per row; RocksDB compacts them in the background
    # of the worker process. What that costs, and the steady state after it, are measured
    # apart: wait until the worker is idle (at most 10 minutes).
    t, w0, last = time.time(), cpu_ms(wpid), cpu_ms(wpid)
    while time.time() - t < 600:
        time.sleep(2)
        now = cpu_ms(wpid)
        if now - last < 40:
            break
        last = now
    settle = {"s": round(time.time() - t, 1), "worker_cpu_s": round((cpu_ms(wpid) - w0) / 1000, 1)}
    log(f"   worker idle again after {settle['s']} s ({settle['worker_cpu_s']} s of CPU: RocksDB compacting "
        f"the map's entries, one per row)")
    cap = []
    for rnd in range(1, rounds + 1):
        for mode, table in (("on", "k"), ("off", "k2")):
            conn.execute(f"UPDATE {table} SET v = v + 1 WHERE id %% 50 = %s", (rnd,))
            conn.execute("CHECKPOINT")
            w0 = cpu_ms(wpid)
            sid = snapshot(conn)
            w = cpu_ms(wpid) - w0
            st = snapshot_stats(conn, sid)
            cap.append({"round": rnd, "key_maps": mode, "pages": st["pages_captured"], "worker_cpu_ms": w,
                        "us_per_page": round(w * 1000 / max(1, st["pages_captured"]), 2)})
    write_csv(b.out / "keys_capture.csv", cap)
    res: dict = {"rows": rows, "pages": pages, "snapshots": nsnaps, "per_snapshot": {}}
    table = []
    for s in at:
        live = med([x["live_ms"] for x in samples if x["snap"] == s])
        asof = med([x["asof_ms"] for x in samples if x["snap"] == s])
        res["per_snapshot"][s] = {"live_ms": live, "asof_ms": asof, "ratio": round(asof / live, 2)}
        table.append([s, f"{live:.3f}", f"{asof:.3f}", f"{asof / live:.2f}"])
    log(md_table(["snapshot", "live lookup ms (client)", "AS OF lookup ms (client)", "AS OF / live"], table))
    res["server_ms"] = server
    log(f"   server-side execution: live {server['live']:.3f} ms, AS OF {server['asof']:.3f} ms")
    res["history_ms"] = med([h["ms"] for h in hist])
    res["history_versions"] = med([h["versions"] for h in hist])
    log(f"   one key's versions over {nsnaps} snapshots: {res['history_ms']:.1f} ms "
        f"({res['history_versions']:.0f} versions)")
    res["ranges"] = {}
    table = []
    for w in widths:
        live, by_map, full = (med([x[f"{m}_ms"] for x in ranges if x["width"] == w]) for m in ("live", "map", "full"))
        res["ranges"][w] = {"live_ms": live, "map_ms": by_map, "full_ms": full, "map_to_full": round(by_map / full, 4)}
        table.append([w, f"{live:.2f}", f"{by_map:.2f}", f"{full:.1f}", f"{by_map / full:.3f}"])
    log(md_table(["keys in the range", "live ms", "AS OF through the map ms", "AS OF full read ms",
                  "map / full"], table))
    on = med([x["us_per_page"] for x in cap if x["key_maps"] == "on"])
    off = med([x["us_per_page"] for x in cap if x["key_maps"] == "off"])
    res["capture_us_per_page"] = {"on": on, "off": off, "ratio": round(on / off, 3)}
    res["settle_after_start"] = settle
    log(f"   capture, worker CPU per page: key maps on {on:.1f} us, off {off:.1f} us ({on / off:.2f})")
    b.finish("keys", res, c, [conn], lambda: None)


BENCHMARKS = ["range", "diff", "parallel", "keys"]


def main() -> int:
    ap = arg_parser(__doc__, BENCHMARKS, HERE / "results", "small smoke test (under 3 minutes)")
    ap.add_argument("--rounds", type=int, help="rounds of the range benchmark")
    ap.add_argument("--diff-rounds", type=int)
    ap.add_argument("--image-cache", help="gsnap.image_cache_size of the range benchmark's cluster "
                    "(e.g. 1GB: every distinct image of the range stays cached, the warm case)")
    ap.add_argument("--fscan-rounds", type=int, default=2,
                    help="rounds that include the (slow) function-scan AS OF diagnostic")
    ap.add_argument("--range-rows", type=int)
    ap.add_argument("--range-ns", help="comma-separated N of the range benchmark")
    ap.add_argument("--diff-rows", type=int)
    ap.add_argument("--diff-ks", help="comma-separated numbers of pages changed of the diff benchmark")
    ap.add_argument("--parallel-rows", type=int)
    ap.add_argument("--keys-rows", type=int)
    ap.add_argument("--keys-snaps", type=int)
    ap.add_argument("--shared-buffers", default="1GB")
    prof = ap.add_mutually_exclusive_group()
    prof.add_argument("--profile", action="store_true", help="perf profiles (default in a full run)")
    prof.add_argument("--no-profile", action="store_true")
    a = ap.parse_args()
    q = a.quick
    a.rounds = a.rounds or (2 if q else 5)
    a.diff_rounds = a.diff_rounds or (3 if q else 7)
    a.range_rows = a.range_rows or (100_000 if q else 300_000)
    a.range_ns = [int(x) for x in a.range_ns.split(",")] if a.range_ns else ([5, 10] if q else [5, 10, 20, 40])
    a.diff_rows = a.diff_rows or (400_000 if q else 2_000_000)
    a.parallel_rows = a.parallel_rows or (300_000 if q else 2_000_000)
    a.keys_rows = a.keys_rows or (200_000 if q else 10_000_000)
    a.keys_snaps = a.keys_snaps or (100 if q else 1000)
    a.diff_ks = [int(x) for x in a.diff_ks.split(",")] if a.diff_ks else (
        [1, 10, 100, 1000] if q else [1, 10, 100, 1000, 3000, 10000])
    do_profile = (a.profile or not q) and not a.no_profile and shutil.which("perf") is not None
    only = set(a.only.split(","))
    b = Bench(a)
    b.do_profile = do_profile
    b.keep_earlier(BENCHMARKS, only)
    b.summary["settings"] = {k: v for k, v in vars(a).items() if k != "out"}
    return b.run([("range", bench_range), ("diff", bench_diff), ("parallel", bench_parallel),
                  ("keys", bench_keys)], only)


if __name__ == "__main__":
    sys.exit(main())
