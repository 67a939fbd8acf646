#!/usr/bin/env python3
"""Benchmarks of gsnap's flashback (see README.md here).

    bench.py [--quick] [--only restore] [--out DIR] [--rows N] [--rounds N]

1. restore  gsnap_restore() of a table (pgbench_accounts' width, a primary key) to a snapshot
            after 0.5%, 5% and 50% of its rows were updated since (spread over the table),
            against the hand-written restore `DELETE FROM t; INSERT INTO t SELECT * FROM
            gsnap_asof(NULL::t, s)`. Each is timed inside a transaction that is then rolled
            back (the table vacuumed, then a snapshot taken as a periodic schedule would),
            alternately, so both start from the same table; the restore's result is checked
            against the snapshot once per fraction, and which diff it ran is recorded.
2. undrop   gsnap_undrop() of a dropped table of --undrop-mb MB (pgbench_accounts' width, a
            primary key and one more index) against CREATE TABLE ... USING gsnap AS SELECT
            from the same snapshot (gsnap_asof_dropped: the same reader), alone and followed
            by the same index builds; and of the same rows in a table without indexes against
            CREATE TABLE AS; each timed in a transaction then rolled back, alternately; the
            undropped rows are checked against the snapshot once.

Results: CSV and summary.json under --out, plots by plot.py. The machine is shared: the two
ways are measured interleaved and compared as ratios within a round.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from common import BenchBase, Cluster, arg_parser, log, md_table, write_csv  # noqa: E402

BENCHMARKS = ["restore", "undrop"]
# Updates of a fraction of the rows, spread evenly: every id that is a multiple of the step.
FRACTIONS = [(0.005, 200), (0.05, 20), (0.5, 2)]


class Bench(BenchBase):
    def cluster(self, name: str) -> Cluster:
        return self.start_cluster(f"bench-flashback-{name}", [
            "shared_buffers = 1GB", "synchronous_commit = off", "max_wal_size = 8GB",
            "min_wal_size = 1GB", "checkpoint_timeout = 30min", "autovacuum = off"])


def timed(conn, statements: list[str], snapshot_after: bool = False) -> float:
    """Seconds the statements take inside a transaction that is then rolled back (and the
    table vacuumed; with `snapshot_after`, a snapshot taken then, as a periodic schedule
    would take one, so that the next round's span holds only the rows it changed)."""
    conn.execute("BEGIN")
    t = time.perf_counter()
    for s in statements:
        conn.execute(s)
    took = time.perf_counter() - t
    conn.execute("ROLLBACK")
    conn.execute("VACUUM t")
    if snapshot_after:
        conn.execute("SELECT gsnap_snapshot()")
    return took


def bench_restore(b: Bench) -> None:
    a = b.args
    log(f"== 1. gsnap_restore of {a.rows:,} rows vs DELETE + INSERT ... SELECT FROM gsnap_asof")
    c = b.cluster("restore")
    conn = c.connect()
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL, pad char(84) NOT NULL) "
                 "USING gsnap WITH (fillfactor = 90)")
    conn.execute(f"INSERT INTO t SELECT g, g % 1000, 0, '' FROM generate_series(1, {a.rows}) g")
    conn.execute("VACUUM (FREEZE, ANALYZE) t")
    snap = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
    want = conn.execute(f"SELECT count(*), sum(v) FROM gsnap_asof(NULL::t, {snap})").fetchone()
    ours = f"SELECT * FROM gsnap_restore('t', {snap})"
    theirs = ["DELETE FROM t", f"INSERT INTO t SELECT * FROM gsnap_asof(NULL::t, {snap})"]
    rows, res = [], {}
    # which way each gsnap_restore went: the diff of two snapshots says so in a NOTICE
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    for fraction, step in FRACTIONS:
        conn.execute(f"UPDATE t SET v = v + 1 WHERE id % {step} = 0")
        conn.execute("VACUUM t")
        counts = conn.execute(ours).fetchone()  # once, committed: checked, then undone below
        got = conn.execute("SELECT count(*), sum(v) FROM t").fetchone()
        assert got == want and counts == (0, a.rows // step, 0), (got, want, counts)
        conn.execute(f"UPDATE t SET v = v + 1 WHERE id % {step} = 0")
        conn.execute("VACUUM t")
        for r in range(a.rounds):
            pair = [("gsnap_restore", [ours]), ("handwritten", theirs)]
            if r % 2:
                pair.reverse()
            took = {}
            for name, stmts in pair:
                notices.clear()
                took[name] = timed(conn, stmts, snapshot_after=True)
                if name == "gsnap_restore":
                    how = "two snapshots" if any("took snapshot" in n for n in notices) else "whole table"
            rows.append({"fraction": fraction, "round": r, "restore_s": took["gsnap_restore"],
                         "handwritten_s": took["handwritten"],
                         "ratio": took["gsnap_restore"] / took["handwritten"], "restore_diff": how})
        mine = [x for x in rows if x["fraction"] == fraction]
        res[str(fraction)] = {
            "rows_changed": a.rows // step,
            "restore_s": statistics.median(x["restore_s"] for x in mine),
            "handwritten_s": statistics.median(x["handwritten_s"] for x in mine),
            "ratio": statistics.median(x["ratio"] for x in mine),
            "restore_diff": sorted({x["restore_diff"] for x in mine}),
        }
        log(f"   {fraction:.1%} changed: gsnap_restore {res[str(fraction)]['restore_s']:.2f} s, handwritten "
            f"{res[str(fraction)]['handwritten_s']:.2f} s: ratio {res[str(fraction)]['ratio']:.3f} "
            f"(diff: {', '.join(res[str(fraction)]['restore_diff'])})")
        conn.execute(ours)  # back to the snapshot for the next fraction
    write_csv(b.out / "restore.csv", rows)
    b.summary["restore"] = {"rows": a.rows, "by_fraction": res}
    log(md_table(["changed", "gsnap_restore (s)", "DELETE + INSERT (s)", "ratio", "restore's diff"],
                 [[f"{float(f):.1%}", f"{v['restore_s']:.2f}", f"{v['handwritten_s']:.2f}", f"{v['ratio']:.3f}",
                   ", ".join(v["restore_diff"])] for f, v in res.items()]))
    conn.close()
    b.drop(c)


def bench_undrop(b: Bench) -> None:
    a = b.args
    rows = a.undrop_mb * 8_400  # ~8,400 rows of this width per MB of heap
    log(f"== 2. gsnap_undrop of a dropped table of {rows:,} rows (~{a.undrop_mb} MB) vs CREATE TABLE AS")
    c = b.cluster("undrop")
    conn = c.connect()
    conn.execute("CREATE TABLE u (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL, pad char(84) NOT NULL) "
                 "USING gsnap")
    conn.execute(f"INSERT INTO u SELECT g, g % 1000, g % 7, '' FROM generate_series(1, {rows}) g")
    conn.execute("CREATE INDEX u_k ON u (k)")
    # the same rows in a table without any index: the load alone
    conn.execute("CREATE TABLE w USING gsnap AS SELECT * FROM u")
    conn.execute("VACUUM (FREEZE, ANALYZE) u")
    conn.execute("VACUUM (FREEZE, ANALYZE) w")
    mb = conn.execute("SELECT pg_relation_size('u') / 1048576").fetchone()[0]
    t = time.perf_counter()
    snap = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
    log(f"   table {mb} MB, snapshot {snap} taken in {time.perf_counter() - t:.1f} s")
    want = conn.execute(f"SELECT count(*), sum(v), sum(k) FROM gsnap_asof(NULL::u, {snap})").fetchone()
    conn.execute("DROP TABLE u, w")
    cols = "id int, k int, v int, pad char(84)"
    ctas = f"CREATE TABLE u USING gsnap AS SELECT * FROM gsnap_asof_dropped('u', {snap}) AS x({cols})"
    indexes = ["ALTER TABLE u ADD PRIMARY KEY (id)", "CREATE INDEX u_k ON u (k)"]
    ours = [f"SELECT gsnap_undrop('u', {snap})"]
    conn.execute("BEGIN")
    conn.execute(ours[0])
    got = conn.execute("SELECT count(*), sum(v), sum(k) FROM u").fetchone()
    conn.execute("ROLLBACK")
    assert got == want, (got, want)
    bare_ctas = f"CREATE TABLE w USING gsnap AS SELECT * FROM gsnap_asof_dropped('w', {snap}) AS x({cols})"
    ways = [("gsnap_undrop", ours), ("ctas", [ctas]), ("ctas_indexes", [ctas, *indexes]),
            ("bare_undrop", [f"SELECT gsnap_undrop('w', {snap})"]), ("bare_ctas", [bare_ctas])]
    out = []
    for r in range(a.rounds):
        order = ways if r % 2 == 0 else list(reversed(ways))
        took = {}
        for name, stmts in order:
            conn.execute("BEGIN")
            t = time.perf_counter()
            for st in stmts:
                conn.execute(st)
            took[name] = time.perf_counter() - t
            conn.execute("ROLLBACK")
        out.append({"round": r, "undrop_s": took["gsnap_undrop"], "ctas_s": took["ctas"],
                    "ctas_indexes_s": took["ctas_indexes"],
                    "ratio_ctas": took["gsnap_undrop"] / took["ctas"],
                    "ratio_ctas_indexes": took["gsnap_undrop"] / took["ctas_indexes"],
                    "bare_undrop_s": took["bare_undrop"], "bare_ctas_s": took["bare_ctas"],
                    "ratio_bare": took["bare_undrop"] / took["bare_ctas"]})
        log(f"   round {r}: undrop {took['gsnap_undrop']:.2f} s, CTAS {took['ctas']:.2f} s, "
            f"CTAS + indexes {took['ctas_indexes']:.2f} s; without indexes: undrop "
            f"{took['bare_undrop']:.2f} s, CTAS {took['bare_ctas']:.2f} s")
    write_csv(b.out / "undrop.csv", out)
    res = {k: statistics.median(x[k] for x in out)
           for k in ("undrop_s", "ctas_s", "ctas_indexes_s", "ratio_ctas", "ratio_ctas_indexes",
                     "bare_undrop_s", "bare_ctas_s", "ratio_bare")}
    b.summary["undrop"] = {"rows": rows, "table_mb": mb, **res}
    log(md_table(["", "gsnap_undrop (s)", "CTAS (s)", "CTAS + indexes (s)", "undrop / CTAS",
                  "undrop / (CTAS + indexes)"],
                 [[f"{mb} MB", f"{res['undrop_s']:.2f}", f"{res['ctas_s']:.2f}", f"{res['ctas_indexes_s']:.2f}",
                   f"{res['ratio_ctas']:.3f}", f"{res['ratio_ctas_indexes']:.3f}"]]))
    log(md_table(["table without indexes", "gsnap_undrop (s)", "CTAS (s)", "undrop / CTAS"],
                 [[f"{mb} MB", f"{res['bare_undrop_s']:.2f}", f"{res['bare_ctas_s']:.2f}",
                   f"{res['ratio_bare']:.3f}"]]))
    conn.close()
    b.drop(c)


def main() -> int:
    ap = arg_parser(__doc__, BENCHMARKS, HERE / "results", "a smoke run of about a minute")
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--undrop-mb", type=int, default=1024)
    a = ap.parse_args()
    if a.quick:
        a.rows, a.rounds, a.undrop_mb = 100_000, 2, 16
    b = Bench(a)
    only = set(a.only.split(","))
    b.keep_earlier(BENCHMARKS, only)
    return b.run([("restore", bench_restore), ("undrop", bench_undrop)], only)


if __name__ == "__main__":
    sys.exit(main())
