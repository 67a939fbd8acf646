"""Differential test: under a concurrent random workload, every snapshot reads back exactly
what its MVCC snapshot saw.

Four clients run inserts (single, bulk, COPY), HOT and non-HOT updates, growing and TOASTed
rows, jsonb changes, deletes, upserts, row locks, long transactions (open across several snapshots),
aborted transactions, savepoints with ROLLBACK TO (and transactions with more
subtransactions than a snapshot can list), and occasional VACUUM, on three gsnap tables,
while autovacuum runs too. Meanwhile snapshots are declared every 0.2-0.5 s with
gsnap_debug_snapshot(); the MVCC snapshot it exports is imported at once and the tables are
read through it: the ground truth. Some snapshots are declared with gsnap_snapshot(false)
in between (no ground truth; they must still be readable). Afterwards gsnap_asof must give
the ground truth exactly for every snapshot and table.

The second test runs the same workload, shorter, with gsnap.debug_declare_pause_ms = 50:
every declaration then keeps its MVCC snapshot for 50 ms before switching dirty sets, which
widens the window the first capture ordering is about (writes landing between the two),
as a busy server would. The third keeps every capture in flight for longer (small batches,
15 ms apart): writers, pruning and VACUUM then race with the captures reading their pages.
The last one overflows the dirty set (gsnap.max_dirty_pages), which falls back to a full
capture.
"""

import random
import time

import pytest

from cluster import Cluster, gsnap_cluster
from workload import (TABLES, GroundTruth, Workload, contents, create_tables, describe_diff,
                      located_contents, set_settings, snapshots)


@pytest.fixture(scope="module")
def diff_cluster():
    yield from gsnap_cluster("differential", [
        # small capture batches: captures interleave with the writes they race against
        "gsnap.capture_batch_pages = 8",
        "autovacuum_naptime = 1",
        "autovacuum_vacuum_threshold = 20",
        "autovacuum_vacuum_scale_factor = 0.01",
        "max_connections = 40",
    ])


def test_every_snapshot_equals_its_mvcc_snapshot_under_concurrent_load(diff_cluster):
    run_differential(diff_cluster, seconds=45, seed=3)


def test_every_snapshot_equals_its_mvcc_snapshot_with_a_widened_declaration_window(diff_cluster):
    run_differential_with(diff_cluster, 30, 5, debug_declare_pause_ms="50ms")


def test_every_snapshot_equals_its_mvcc_snapshot_with_captures_held_in_flight(diff_cluster):
    run_differential_with(diff_cluster, 30, 11, capture_batch_pages=4, debug_capture_pause_ms="15ms")


def test_every_snapshot_equals_its_mvcc_snapshot_with_every_page_decided_under_its_lock(diff_cluster):
    """gsnap.capture_page_copies off: no page is copied whole and decided after the release;
    PostgreSQL's own visibility test decides every page while the snapshot is held (the path
    pages with TOAST values and overflowed snapshots always take)."""
    run_differential_with(diff_cluster, 20, 17, capture_page_copies="off")


def test_every_snapshot_equals_its_mvcc_snapshot_when_the_copies_overflow_their_memory(diff_cluster):
    """gsnap.capture_memory far below a span's pages: phase one copies what fits, the rest is
    stored as it is read, under the snapshot; both kinds of page in every capture."""
    run_differential_with(diff_cluster, 20, 13, capture_memory="64kB", capture_batch_pages=4,
                          debug_capture_pause_ms="15ms")


def run_differential_with(c, seconds: float, seed: int, **settings) -> None:
    """The differential check with these gsnap settings, reset afterwards."""
    with c.connect() as conn:
        set_settings(conn, **settings)
    try:
        run_differential(c, seconds=seconds, seed=seed)
    finally:
        with c.connect() as conn:
            set_settings(conn, **{name: None for name in settings})


def run_differential(c, seconds: float, seed: int) -> None:
    with c.connect() as conn:
        conn.execute("DROP TABLE IF EXISTS " + ", ".join(TABLES))
        create_tables(conn)
        first = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        for t in TABLES:
            assert contents(conn, t, first) == contents(conn, t), f"{t} differs at snapshot {first}"

    truth = GroundTruth(c, TABLES)
    undocumented = []  # gsnap_snapshot(false) declarations
    rng = random.Random(seed)
    try:
        with Workload(c, n=4, seed=seed) as load:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(rng.uniform(0.2, 0.5))
                if rng.random() < 0.15:
                    undocumented.append(
                        truth.decl.execute("SELECT gsnap_snapshot(false)").fetchone()[0])
                else:
                    truth.take()
                dead = [cl.name for cl in load.clients if not cl.is_alive()]
                assert not dead or load.stop.is_set(), (
                    f"clients stopped early: {[(cl.name, cl.error) for cl in load.clients if cl.error]}")
            stats = load.finish()

        with c.connect() as conn:
            problems = truth.check(conn)
            if problems:
                pytest.fail(f"{len(problems)} (snapshot, table) pairs differ from their MVCC snapshot:\n"
                            + "\n".join(problems[:10]))

            for snap in undocumented:
                for t in TABLES:
                    contents(conn, t, snap)  # readable without error

            # AS OF a time: the latest snapshot taken at or before it.
            listing = snapshots(conn)
            for snap in rng.sample(sorted(truth.truth), 5):
                at = listing[snap]["taken_at"]
                later = [s for s, i in listing.items() if s > snap and i["taken_at"] <= at]
                assert not later, f"snapshots {later} were taken after {snap} with an earlier time"
                expected, where = truth.truth[snap]["w_acct"]
                got = contents(conn, "w_acct", at)
                if got != expected:
                    pytest.fail(f"gsnap_asof(NULL::w_acct, '{at}') vs snapshot {snap} taken then:\n"
                                + describe_diff(expected, got, where))

            # Quiet now: a new snapshot equals the live tables.
            last = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
            for t in TABLES:
                live, where = located_contents(conn, t)
                got = contents(conn, t, last)
                if got != live:
                    pytest.fail(f"{t} at the final snapshot {last}:\n" + describe_diff(live, got, where))

            listing = snapshots(conn)
    finally:
        truth.close()

    mine = set(truth.truth) | set(undocumented) | {first, last}
    states = {s: listing[s]["state"] for s in mine if s in listing}
    assert set(states.values()) == {"committed"}, f"snapshots not committed: " + str(
        {s: (listing[s]["state"], listing[s]["failure"]) for s in mine if listing.get(s, {}).get("state") != "committed"})

    carried = sum(listing[s]["carried_pages"] for s in truth.truth)
    print(f"{len(truth.truth)} snapshots with ground truth, {len(undocumented)} without; "
          f"{carried} unsettled pages carried; {stats}")
    # The test did what it claims: enough snapshots, writes of every kind, unsettled pages.
    assert len(truth.truth) >= 30, f"only {len(truth.truth)} snapshots with ground truth"
    assert stats.committed >= 5 * seconds and stats.rows_changed >= 25 * seconds, stats
    assert stats.aborted >= 10 and stats.long_xacts >= 5 and stats.savepoints >= 10, stats
    for kind in ("insert", "hot_update", "nonhot_update", "grow_update", "delete", "upsert",
                 "lock", "copy", "bulk_insert", "toast_update"):
        assert stats.kinds[kind] > 0, f"no {kind} statement ran: {stats}"
    assert stats.vacuums > 0, stats
    assert carried > 0, "no snapshot carried an unsettled page: the workload never had writes in flight"
    distinct = len({tuple(frozenset(v[0].items()) for v in truth.truth[s].values()) for s in truth.truth})
    assert distinct > len(truth.truth) // 2, "the snapshots barely differ: the workload did not change the tables"


def test_snapshots_stay_exact_when_the_dirty_set_overflows():
    """A span that writes more pages than gsnap.max_dirty_pages falls back to a full capture
    of the table: still exact, with a transaction open across the snapshot."""
    c = Cluster("overflow", conf=["gsnap.max_dirty_pages = 1024", "autovacuum = off"]).start()
    try:
        with c.connect() as conn, c.connect() as open_xact:
            conn.execute("CREATE EXTENSION gsnap")
            conn.execute("CREATE TABLE ovf (id int PRIMARY KEY, v int NOT NULL, pad text) USING gsnap")
            conn.execute("INSERT INTO ovf SELECT i, 0, repeat('o', 200) FROM generate_series(1, 60000) i")
            pages = conn.execute("SELECT pg_relation_size('ovf') / 8192").fetchone()[0]
            assert pages > 1400
            first = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
            # every page written in one span, plus an open transaction's writes
            conn.execute("UPDATE ovf SET v = 1 WHERE id % 40 = 0")
            conn.execute("DELETE FROM ovf WHERE id % 45 = 0")
            open_xact.execute("BEGIN")
            open_xact.execute("UPDATE ovf SET v = 2 WHERE id % 1000 = 1")
            open_xact.execute("INSERT INTO ovf VALUES (100001, 3, 'open')")
            truth = GroundTruth(c, ["ovf"])
            try:
                snap = truth.take()
                open_xact.execute("COMMIT")
                assert "did not fit the dirty set" in c.log(), (
                    "premise: the span's writes overflowed the dirty set")
                problems = truth.check(conn)
                if problems:
                    pytest.fail("\n".join(problems))
            finally:
                truth.close()
            after = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
            live, where = located_contents(conn, "ovf")
            got = contents(conn, "ovf", after)
            if got != live:
                pytest.fail(f"snapshot {after} vs the live table:\n" + describe_diff(live, got, where))
            assert contents(conn, "ovf", first) != got
    finally:
        c.destroy()
