"""How the AS OF node hands its rows to the executor (`src/exec/node.rs`, `exec`).

A scan without conditions whose rows need no projection, or are projected to no columns
(`count(*)`), fetches its rows itself instead of going through ExecScan: it must still give
the same rows as the other paths (conditions, projections, parallel plans) and still answer
a cancel in the middle of the rows when every page comes from the image cache and the scan
never waits for the worker (where a wait would check for interrupts).
"""

import time

import pytest
from psycopg import errors

from cluster import gsnap_cluster, reset_timeout

ROWS = 3_000_000
SUM_V = sum(g % 7 for g in range(1, ROWS + 1))
SEVENS = [sum(1 for g in range(1, ROWS + 1) if g % 7 == r) for r in range(7)]


@pytest.fixture(scope="module")
def cluster():
    # Big enough to hold every image of the table below (~13,000 pages).
    yield from gsnap_cluster("scanrows", ["gsnap.image_cache_size = 256MB"])


@pytest.fixture(scope="module")
def table(cluster):
    with cluster.connect() as conn:
        conn.autocommit = True
        conn.execute("CREATE TABLE sr (id int, v int) USING gsnap")
        conn.execute(f"INSERT INTO sr SELECT g, g % 7 FROM generate_series(1, {ROWS}) g")
        snap = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        conn.execute("DELETE FROM sr WHERE id % 2 = 0")
        yield snap


def val(conn, sql: str):
    return conn.execute(sql).fetchone()[0]


def test_every_way_of_handing_rows_out_gives_the_snapshots_rows(cluster, table):
    """count(*) (projected to no columns), whole rows (no projection), a projection and a
    condition (through ExecScan), serial and parallel: the rows of the snapshot, not the
    table's rows now (half of them deleted since)."""
    src = f"gsnap_asof(NULL::sr, {table})"
    with cluster.connect() as conn:
        conn.autocommit = True
        for mode in ("SET max_parallel_workers_per_gather = 0",
                     "SET max_parallel_workers_per_gather = 2; SET parallel_setup_cost = 0; "
                     "SET min_parallel_table_scan_size = 0"):
            conn.execute(mode)
            assert val(conn, f"SELECT count(*) FROM {src}") == ROWS
            assert conn.execute(f"SELECT count(*), sum(id), sum(v) FROM (SELECT * FROM {src}) s"
                                ).fetchone() == (ROWS, ROWS * (ROWS + 1) // 2, SUM_V)
            assert val(conn, f"SELECT sum(v + 1) FROM {src}") == SUM_V + ROWS
            assert val(conn, f"SELECT count(*) FROM {src} WHERE v = 3") == SEVENS[3]
            # an empty result: the end of the rows as the first row
            assert val(conn, f"SELECT count(*) FROM gsnap_asof(NULL::sr, {table}) "
                             f"WHERE id < 0") == 0
        assert val(conn, "SELECT count(*) FROM sr") == ROWS // 2


def test_a_parallel_join_of_two_snapshot_scans(cluster, table):
    """A parallel query reading the snapshot twice (a join of two AS OF scans): each process
    keeps at most its share of the image cache pinned across both scans (a scan that needs
    a batch while the other holds the share copies it out, `read::pins::parallel_batch`);
    the join sees every row of both sides."""
    src = f"gsnap_asof(NULL::sr, {table})"
    tenth = range(10, ROWS + 1, 10)
    with cluster.connect() as conn:
        conn.autocommit = True
        conn.execute("SET max_parallel_workers_per_gather = 2; SET parallel_setup_cost = 0; "
                     "SET min_parallel_table_scan_size = 0")
        q = (f"SELECT count(*), sum(a.v + b.v) FROM {src} a JOIN {src} b ON a.id = b.id "
             f"WHERE a.id % 10 = 0 AND b.id % 10 = 0")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (COSTS OFF) " + q))
        assert "Gather" in plan and plan.count("gsnap AS OF") == 2, plan
        assert conn.execute(q).fetchone() == (len(tenth), 2 * sum(g % 7 for g in tenth))


def test_a_count_over_cached_pages_is_cancelled_in_the_middle_of_its_rows(cluster, table):
    src = f"gsnap_asof(NULL::sr, {table})"
    with cluster.connect() as conn:
        conn.autocommit = True
        conn.execute("SET max_parallel_workers_per_gather = 0")
        stats = "SELECT image_loads FROM gsnap_index_stats()"
        val(conn, f"SELECT count(*) FROM {src}")  # every image into the cache
        loads = val(conn, stats)
        t0 = time.monotonic()
        assert val(conn, f"SELECT count(*) FROM {src}") == ROWS
        full = time.monotonic() - t0
        assert val(conn, stats) == loads, "the scan waited for the worker: not all cached"
        # Fired well after the scan's start (planning and its requests to the worker wait,
        # and a wait answers a cancel), while it counts the rows.
        timeout_ms = max(20, int(full * 1000 * 0.4))
        cancelled = 0
        for _ in range(3):
            conn.execute(f"SET statement_timeout = {timeout_ms}")
            try:
                val(conn, f"SELECT count(*) FROM {src}")
            except errors.QueryCanceled:
                cancelled += 1
            finally:
                reset_timeout(conn)
        assert cancelled == 3, (
            f"{3 - cancelled} of 3 counts over {ROWS} cached rows ({full * 1000:.0f} ms each) "
            f"ran to the end through a statement_timeout of {timeout_ms} ms")
        assert val(conn, stats) == loads
