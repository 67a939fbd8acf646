"""Crashes (kill -9 of the postmaster and every child): committed snapshots survive exactly,
interrupted ones are failed (never half-present, never left 'capturing', never readable), and
the first snapshot after a restart is correct although the dirty sets were lost.

(a) a random workload with periodic snapshots (gsnap.snapshot_interval = 1) is killed in
    full flight, three times; every snapshot seen committed before a crash must read back
    the same digest after every later crash, and snapshots with a ground truth (exported
    MVCC snapshots) must equal it;
(b) the server is killed in the middle of a capture held in flight with
    gsnap.debug_capture_pause_ms, after writes the lost dirty sets had recorded: twice with
    kill -9 of the postmaster (the second time with another snapshot queued behind the one
    in flight), once with kill -9 of the gsnap worker alone (the postmaster's crash
    recovery). Each time a prepared transaction outlives the crash; it commits (or rolls
    back) after the restart without writing a page, and the next snapshot must see that.
"""

import os
import signal
import time

import psycopg
import pytest

from cluster import Cluster
from workload import (TABLES, GroundTruth, Workload, contents, create_tables, describe_diff,
                      digest, located_contents, progress, set_settings, snapshots, wait_until,
                      wait_worker_ready, worker_restarted)


def crash_and_restart(c: Cluster, settings_after: dict[str, str | None]) -> None:
    """Writes settings for the next start (ALTER SYSTEM without reload), kills the server,
    starts it again and waits for the gsnap worker."""
    with c.connect() as conn:
        for name, value in settings_after.items():
            if value is None:
                conn.execute(f"ALTER SYSTEM RESET gsnap.{name}")
            else:
                conn.execute(f"ALTER SYSTEM SET gsnap.{name} = '{value}'")
    c.crash()
    c.start()
    wait_worker_ready(c)


def check_after_crash(conn, recorded: dict[int, dict], truth: GroundTruth | None, table: str) -> dict[int, dict]:
    """Every snapshot is committed or failed; recorded digests and ground truths hold; failed
    ones cannot be read. Returns the listing."""
    listing = snapshots(conn)
    stuck = {s: i["state"] for s, i in listing.items() if i["state"] not in ("committed", "failed")}
    assert not stuck, f"snapshots left in an unfinished state after the crash: {stuck}"
    lost = [s for s in recorded if listing.get(s, {}).get("state") != "committed"]
    assert not lost, f"snapshots committed before the crash are no longer committed: " + str(
        {s: listing.get(s) for s in lost})
    changed = []
    for s, digests in sorted(recorded.items()):
        for t, d in digests.items():
            now = digest(conn, t, s)
            if now != d:
                changed.append(f"snapshot {s}, {t}: {d} before the crash, {now} after")
    assert not changed, "committed snapshots read differently after the crash:\n" + "\n".join(changed)
    if truth is not None:
        committed = [s for s in truth.truth if listing[s]["state"] == "committed"]
        problems = truth.check(conn, committed)
        if problems:
            pytest.fail(f"{len(problems)} (snapshot, table) pairs differ from their MVCC snapshot after "
                        "the crash:\n" + "\n".join(problems[:10]))
    for s, info in listing.items():
        if info["state"] == "failed":
            assert info["failure"], f"failed snapshot {s} gives no reason"
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="failed"):
                contents(conn, table, s)
    return listing


def assert_snapshot_equals_live(conn, tables: list[str], what: str) -> int:
    snap = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
    for t in tables:
        live, where = located_contents(conn, t)
        got = contents(conn, t, snap)
        if got != live:
            pytest.fail(f"{what}: snapshot {snap} of {t} vs the live table:\n" + describe_diff(live, got, where))
    return snap


def test_committed_snapshots_survive_crashes_under_load():
    c = Cluster("crash-load", conf=[
        "gsnap.snapshot_interval = 1",
        "gsnap.capture_batch_pages = 16",
        # captures take a little longer, so that the kill is likely to interrupt one
        "gsnap.debug_capture_pause_ms = 30",
        "max_connections = 40",
    ]).start()
    try:
        with c.connect() as conn:
            conn.execute("CREATE EXTENSION gsnap")
            create_tables(conn)
        recorded: dict[int, dict] = {}
        for cycle in range(3):
            truth = GroundTruth(c, TABLES)
            load = Workload(c, n=3, seed=100 + cycle, epoch=cycle, vacuum_probability=0.02)
            with load:
                with c.connect() as conn:
                    set_settings(conn, snapshot_interval="1s")
                    start = max(snapshots(conn), default=0)
                    end = time.monotonic() + 7 + cycle
                    while time.monotonic() < end:
                        time.sleep(0.4)
                        truth.take()
                        for s, info in snapshots(conn).items():
                            if s > start and s not in recorded and info["state"] == "committed":
                                recorded[s] = {t: digest(conn, t, s) for t in TABLES}
                    new = [s for s in recorded if s > start]
                    assert len(new) >= 3, f"cycle {cycle}: only {len(new)} periodic snapshots committed"
                    # No snapshot after the restart until we ask (the interval is 0 then).
                    conn.execute("ALTER SYSTEM SET gsnap.snapshot_interval = 0")
                    # Preferably kill it in the middle of a capture (not required: (b) does).
                    deadline = time.monotonic() + 3
                    while time.monotonic() < deadline and progress(conn)["phase"] != "capturing":
                        time.sleep(0.005)
                load.killed.set()
                c.crash()  # with the clients and the worker in full flight
            truth.decl.close()
            truth.reader.close()
            errors = [f"{cl.name}: {cl.error!r}" for cl in load.clients if cl.error]
            assert not errors, "workload clients failed before the crash:\n" + "\n".join(errors)
            c.start()
            wait_worker_ready(c)
            with c.connect() as conn:
                listing = check_after_crash(conn, recorded, truth, "w_acct")
                print(f"crash {cycle + 1}: {len(listing)} snapshots, "
                      f"{sum(i['state'] == 'failed' for i in listing.values())} failed, "
                      f"{len(truth.truth)} with ground truth")
                # The first snapshot after the restart captures everything.
                snap = assert_snapshot_equals_live(conn, TABLES, f"after crash {cycle + 1}")
                recorded[snap] = {t: digest(conn, t, snap) for t in TABLES}
        assert len(recorded) >= 12
    finally:
        c.destroy()


def test_crash_in_the_middle_of_a_capture():
    c = Cluster("crash-capture", conf=["autovacuum = off", "max_prepared_transactions = 4"]).start()
    try:
        with c.connect() as conn:
            conn.execute("CREATE EXTENSION gsnap")
            conn.execute("CREATE TABLE big (id int PRIMARY KEY, v int NOT NULL, pad text) USING gsnap")
            conn.execute("CREATE TABLE small (id int PRIMARY KEY, v int NOT NULL) USING gsnap")
            conn.execute("INSERT INTO big SELECT i, 0, repeat(md5(i::text), 3) FROM generate_series(1, 30000) i")
            conn.execute("INSERT INTO small SELECT i, 0 FROM generate_series(1, 100) i")
            s1 = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
            recorded = {s1: {t: digest(conn, t, s1) for t in ("big", "small")}}
            for t in ("big", "small"):
                assert recorded[s1][t] == digest(conn, t), f"{t} at snapshot {s1}"

        # 0: kill -9 of the postmaster and all; 1: the same with a second snapshot queued
        # behind the one in flight; 2: kill -9 of the gsnap worker alone (the postmaster then
        # ends every backend and reinitializes shared memory, dirty sets included).
        for cycle in range(3):
            with c.connect() as conn:
                # Writes all over the table: the dirty set of the next snapshot's span.
                conn.execute("UPDATE big SET v = v + 1 WHERE id %% 40 = %s", (cycle,))
                conn.execute("DELETE FROM big WHERE id %% 97 = %s", (cycle,))
                conn.execute("INSERT INTO big SELECT i, 1, 'new' FROM generate_series(%s, %s) i",
                             (100000 * (cycle + 1), 100000 * (cycle + 1) + 499))
                conn.execute("UPDATE small SET v = v + 1 WHERE id % 3 = 0")
                # A prepared transaction outlives the crash, still in progress.
                conn.execute("BEGIN")
                conn.execute("UPDATE small SET v = -1 WHERE id = %s", (100 - 3 * cycle,))
                conn.execute("INSERT INTO big VALUES (%s, -1, 'prepared')", (900000 + cycle,))
                conn.execute(f"PREPARE TRANSACTION 'p{cycle}'")
                set_settings(conn, capture_batch_pages=2, debug_capture_pause_ms="200ms")
                doomed = [conn.execute("SELECT gsnap_snapshot(false)").fetchone()[0]]
                p = wait_until(lambda: (lambda p: p if p["phase"] == "capturing" and p["snap_id"] == doomed[0]
                                        and 0 < p["pages_done"] < p["pages_total"] else None)(progress(conn)),
                               30, f"the capture of snapshot {doomed[0]} to be under way")
                # Writes of the following span (its dirty set is lost too).
                conn.execute("UPDATE big SET v = v + 10 WHERE id %% 53 = %s", (cycle,))
                if cycle == 1:
                    doomed.append(conn.execute("SELECT gsnap_snapshot(false)").fetchone()[0])
                    conn.execute("UPDATE big SET v = v + 100 WHERE id % 61 = 0")
                # (not p["phase"]: it reads 'declaring' once another snapshot was declared, see
                # test_orderings.py::test_progress_shows_a_capture_in_flight_as_capturing)
                p = progress(conn)
                states = {s: snapshots(conn)[s]["state"] for s in doomed}
                assert p["snap_id"] == doomed[0] and p["pages_done"] < p["pages_total"] \
                    and set(states.values()) == {"capturing"}, (
                    f"premise: the capture of {doomed[0]} must still be in flight at the crash ({p}, {states})")
            if cycle < 2:
                crash_and_restart(c, {"capture_batch_pages": None, "debug_capture_pause_ms": None})
            else:
                c.kill(p["worker_pid"], signal.SIGKILL)
                wait_until(lambda: worker_restarted(c, p["worker_pid"]), 60,
                           "the postmaster to restart after the gsnap worker was killed")
                with c.connect() as conn:
                    set_settings(conn, capture_batch_pages=None, debug_capture_pause_ms=None)

            with c.connect() as conn:
                listing = check_after_crash(conn, recorded, None, "big")
                for s in doomed:
                    assert listing[s]["state"] == "failed", (
                        f"snapshot {s}, interrupted by crash {cycle + 1}, is {listing[s]['state']}")
                    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="failed"):
                        contents(conn, "big", s)
                snap = assert_snapshot_equals_live(conn, ["big", "small"], f"after crash {cycle + 1}")
                recorded[snap] = {t: digest(conn, t, snap) for t in ("big", "small")}
                assert recorded[snap]["big"] != recorded[s1]["big"]
                # The prepared transaction finishes, with no page written: the next snapshot
                # must see the outcome (its pages were carried as unsettled).
                finish = "COMMIT" if cycle != 1 else "ROLLBACK"
                conn.execute(f"{finish} PREPARED 'p{cycle}'")
                for t in ("big", "small"):
                    assert not conn.execute("SELECT gsnap_written_blocks(%s)", (t,)).fetchall()
                snap = assert_snapshot_equals_live(
                    conn, ["big", "small"], f"after {finish} PREPARED of a transaction prepared before crash {cycle + 1}")
                recorded[snap] = {t: digest(conn, t, snap) for t in ("big", "small")}
                # and it stays right for the next, incremental snapshot
                conn.execute("UPDATE big SET v = v + 1 WHERE id %% 77 = %s", (cycle,))
                snap = assert_snapshot_equals_live(conn, ["big", "small"], f"the second snapshot after crash {cycle + 1}")
                recorded[snap] = {t: digest(conn, t, snap) for t in ("big", "small")}
    finally:
        c.destroy()
