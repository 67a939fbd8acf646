"""Operational behaviour of gsnap on real clusters: periodic snapshots under pgbench, writers
that never wait for a capture, the locks between declarations and storage-replacing
commands, the worker's restarts and cancelled waits. Store directory problems, the dirty-set
overflow, other databases and dump/restore are in test_ops_store.py and test_ops_misc.py.

Every wait is bounded and says what it waited for. Measured latencies are printed with the
prefix "[ops]" (run pytest with -s to see them).
"""

from __future__ import annotations

import re
import time

import psycopg
import pytest
from psycopg import errors

from cluster import cancelled_part_way, reset_timeout, worker_caught_up
from ops_helpers import (
    Bg,
    PGBENCH_ENV,
    asof,
    configure,
    declare_in_background,
    digest,
    drop_database,
    in_flight,
    make_table,
    measure,
    ops,  # noqa: F401 - the module's cluster fixture
    progress,
    slow_capture,
    snapshot_row,
    snapshots,
    val,
    wait_capturing,
    wait_ready,
    wait_server,
    wait_settled,
    wait_until,
)


# -- 1. periodic snapshots ---------------------------------------------------------------------


def test_periodic_snapshots_follow_the_interval_and_are_consistent(ops):
    """gsnap.snapshot_interval = 1 under pgbench: about one snapshot per second, all
    committed, each one transactionally consistent (pgbench's balance invariant holds AS OF
    every snapshot), the latest equal to the live tables once pgbench stops; interval 0
    (reload) stops them."""
    tables = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")
    with ops.connect() as conn:
        try:
            ops.run("pgbench", "-i", "-s", "1", "-q", env=PGBENCH_ENV)
            before = {s["snap_id"] for s in snapshots(conn)}
            configure(conn, snapshot_interval=1)
            t0 = time.monotonic()
            try:
                out = ops.run("pgbench", "-c", "4", "-j", "2", "-T", "5", "-n", env=PGBENCH_ENV).stdout
            finally:
                configure(conn, snapshot_interval=0)
            elapsed = time.monotonic() - t0
            processed = int(re.search(r"actually processed: (\d+)", out).group(1))
            assert processed > 100, out
            wait_settled(conn, 60)
            new = [s for s in snapshots(conn) if s["snap_id"] not in before]
            print(f"[ops] periodic: {len(new)} snapshots in {elapsed:.1f} s of pgbench "
                  f"({processed} transactions)")
            assert elapsed * 0.5 - 1 <= len(new) <= elapsed + 2, (
                f"{len(new)} periodic snapshots in {elapsed:.1f} s with gsnap.snapshot_interval = 1")
            assert all(s["state"] == "committed" for s in new), [
                (s["snap_id"], s["state"], s["failure"]) for s in new]
            gaps = [(b["taken_at"] - a["taken_at"]).total_seconds() for a, b in zip(new, new[1:])]
            print(f"[ops] periodic: gaps between snapshots {[round(g, 2) for g in gaps]}")
            assert gaps and 0.8 <= sum(gaps) / len(gaps) <= 2.5, gaps

            # Transactionally consistent: pgbench moves each delta into the three balances in
            # one transaction, so every snapshot sees equal sums.
            nonzero = 0
            history = []
            for s in new:
                v = s["snap_id"]
                a, b, t, h = conn.execute(
                    f"SELECT (SELECT sum(abalance) FROM {asof('pgbench_accounts', v)}),"
                    f" (SELECT sum(bbalance) FROM {asof('pgbench_branches', v)}),"
                    f" (SELECT sum(tbalance) FROM {asof('pgbench_tellers', v)}),"
                    f" (SELECT count(*) FROM {asof('pgbench_history', v)})"
                ).fetchone()
                assert a == b == t, f"snapshot {v}: sum(abalance) {a}, sum(bbalance) {b}, sum(tbalance) {t}"
                nonzero += a != 0
                history.append(h)
            assert nonzero > 0, "no snapshot saw any pgbench transaction"
            assert history == sorted(history), f"history rows per snapshot not growing: {history}"

            # pgbench has stopped: the latest snapshot (by id, and by time) is the live data.
            last = new[-1]["snap_id"]
            if val(conn, "SELECT count(*) FROM pgbench_history") != history[-1]:
                last = val(conn, "SELECT gsnap_snapshot()")
            for tname in tables:
                live = digest(conn, tname)
                assert digest(conn, asof(tname, last)) == live, f"{tname} AS OF {last}"
            by_time = digest(conn, f"gsnap_asof(NULL::pgbench_accounts, now())")
            assert by_time == digest(conn, "pgbench_accounts")

            # Interval 0: no more snapshots.
            n = len(snapshots(conn))
            time.sleep(3)  # a window in which no snapshot may come (the time is the point)
            assert len(snapshots(conn)) == n, "snapshots kept coming with gsnap.snapshot_interval = 0"
        finally:
            conn.execute("DROP TABLE IF EXISTS " + ", ".join(tables))


# -- 2. writers never wait -----------------------------------------------------------------------


def test_writers_and_declarations_do_not_wait_for_a_capture(ops):
    """While a long capture is in flight (debug pause between batches), INSERT/UPDATE/DELETE on
    the table being captured and on other tables, and gsnap_snapshot(false), all return
    promptly; the snapshot still holds exactly what its MVCC snapshot saw."""
    with ops.connect() as conn, ops.connect() as truth:
        make_table(conn, "ops_big", 14000)
        make_table(conn, "ops_other", 2000)
        conn.execute("DROP TABLE IF EXISTS ops_heap")
        conn.execute("CREATE TABLE ops_heap (id int PRIMARY KEY, v int) USING heap")
        conn.execute("INSERT INTO ops_heap SELECT g, 0 FROM generate_series(1, 1000) g")
        snap = None
        try:
            with slow_capture(conn):
                snap, exported = conn.execute("SELECT * FROM gsnap_debug_snapshot()").fetchone()
                wait_capturing(conn, snap)
                lat = {}
                stmts = {
                    "INSERT same table": "INSERT INTO ops_big VALUES (100000 + {i}, {i}, 'new')",
                    "UPDATE 1 row same table": "UPDATE ops_big SET v = v + 1 WHERE id = {i} * 97 + 1",
                    "UPDATE 140 rows same table": "UPDATE ops_big SET v = v + 1 WHERE id % 100 = {i}",
                    "DELETE same table": "DELETE FROM ops_big WHERE id = {i} * 131 + 7",
                    "INSERT other gsnap table": "INSERT INTO ops_other VALUES (100000 + {i}, {i}, 'new')",
                    "UPDATE other gsnap table": "UPDATE ops_other SET v = v + 1 WHERE id % 50 = {i}",
                    "INSERT heap table": "INSERT INTO ops_heap VALUES (100000 + {i}, {i})",
                    "SELECT same table": "SELECT count(*) FROM ops_big WHERE id % 100 = {i}",
                }
                for i in range(5):
                    for name, sql in stmts.items():
                        lat.setdefault(name, []).append(measure(conn, sql.format(i=i)))
                declared = []
                for _ in range(3):
                    t = time.monotonic()
                    declared.append(val(conn, "SELECT gsnap_snapshot(false)"))
                    lat.setdefault("gsnap_snapshot(false)", []).append(time.monotonic() - t)
                p = in_flight(conn, snap)
                assert p, f"the capture of {snap} ended before the measurements did: {progress(conn)}"
                print(f"[ops] during the capture of snapshot {snap} ({p['pages_done']}/{p['pages_total']} pages):")
                for name, xs in lat.items():
                    print(f"[ops]   {name}: max {max(xs) * 1000:.1f} ms, median {sorted(xs)[len(xs) // 2] * 1000:.1f} ms")
                for name, xs in lat.items():
                    assert max(xs) < 1.0, f"{name} took {max(xs):.3f} s during a capture"
                assert declared == sorted(declared) and declared[0] > snap, declared
                assert progress(conn)["queued"] >= 3

                truth.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                truth.execute(f"SET TRANSACTION SNAPSHOT '{exported}'")
                expected = {t: digest(truth, t) for t in ("ops_big", "ops_other")}
                truth.execute("COMMIT")
            states = wait_settled(conn, 60)
            assert all(states[s] == "committed" for s in [snap, *declared]), states
            for t, d in expected.items():
                assert digest(conn, asof(t, snap)) == d, f"{t} AS OF {snap} differs from its MVCC snapshot"
                assert digest(conn, asof(t, declared[-1])) == digest(conn, t), f"{t} AS OF {declared[-1]}"
        finally:
            if snap is not None:
                conn.execute("SELECT gsnap_debug_release(%s)", (snap,))
            conn.execute("DROP TABLE IF EXISTS ops_big, ops_other, ops_heap")


def test_progress_reports_a_capture_in_flight(ops):
    """gsnap_progress() during a capture: phase 'capturing', pages advancing, and the same
    after another snapshot was declared meanwhile (queued = 1)."""
    t = "ops_prog"
    with ops.connect() as conn:
        make_table(conn, t, 6000)
        try:
            with slow_capture(conn):
                snap = val(conn, "SELECT gsnap_snapshot(false)")
                p1 = wait_capturing(conn, snap)
                assert p1["phase"] == "capturing", p1
                val(conn, "SELECT gsnap_snapshot(false)")
                mark = progress(conn)["pages_done"]

                def advanced():  # a batch captured since (or the capture over: asserted below)
                    p = in_flight(conn, snap)
                    return "over" if p is None else p["pages_done"] > mark and p
                p2 = wait_until(advanced, 10, f"the capture of snapshot {snap} to advance")
                p2 = None if p2 == "over" else p2
                assert p2 and p2["pages_done"] > p1["pages_done"], (p1, p2)
                assert p2["queued"] == 1, p2
                assert p2["phase"] == "capturing", (
                    f"gsnap_progress().phase is {p2['phase']!r} while snapshot {snap} is being "
                    f"captured ({p2['pages_done']}/{p2['pages_total']} pages) and the next one "
                    f"is already declared")
            wait_settled(conn, 60)
            assert progress(conn)["phase"] == "idle"
        finally:
            conn.execute(f"DROP TABLE IF EXISTS {t}")


# -- 3. locks ------------------------------------------------------------------------------------


REWRITES = {
    "truncate": "TRUNCATE {t}",
    "rewriting alter": "ALTER TABLE {t} ALTER COLUMN v TYPE bigint",
    "cluster": "CLUSTER {t} USING {t}_pkey",
}


def test_a_declaration_waits_for_room_in_the_capture_queue_and_says_so(ops):
    """With gsnap.max_queued_snapshots snapshots waiting for their capture, a declaration waits
    (it is not refused, and no snapshot is lost): gsnap_progress() counts it in
    declarations_held, the session gets one NOTICE saying why after a second, and the
    snapshot is declared as soon as a capture ends."""
    t = "ops_queue"
    with ops.connect() as conn:
        make_table(conn, t, 3000)
        bg = None
        try:
            with slow_capture(conn):
                configure(conn, max_queued_snapshots=1)
                first = val(conn, "SELECT gsnap_snapshot(false)")
                wait_capturing(conn, first)
                bg, told = declare_in_background(ops)
                wait_until(lambda: progress(conn)["declarations_held"] == 1, 10,
                           "gsnap_progress().declarations_held = 1")
                wait_until(lambda: told, 10, "a NOTICE to the waiting session")
                assert told == ["gsnap: waiting for room in the capture queue "
                                "(gsnap.max_queued_snapshots = 1)"], told
                assert bg.is_alive() and in_flight(conn, first), (bg.result, bg.error, progress(conn))
            # The pause is lifted: the capture ends and the held declaration goes through.
            bg.wait(30, "the held declaration after the capture")
            assert bg.error is None, bg.error
            assert bg.result > first
            assert told == told[:1], f"told more than once: {told}"
            wait_settled(conn, 30)
            assert progress(conn)["declarations_held"] == 0
            assert snapshot_row(conn, bg.result)["state"] == "committed"
            assert digest(conn, asof(t, bg.result)) == digest(conn, t)
        finally:
            if bg is not None:
                bg.stop()
            configure(conn, max_queued_snapshots=None)
            conn.execute(f"DROP TABLE IF EXISTS {t}")


@pytest.mark.parametrize("kind", list(REWRITES))
def test_declaration_waits_for_an_open_rewrite(ops, kind):
    """A TRUNCATE (or rewriting ALTER TABLE, or CLUSTER) open in a transaction holds off the
    declaration:
    gsnap_snapshot(false) waits, gsnap_progress() names the table, the waiting session is told
    so in a NOTICE after a second, and the snapshot is declared right after COMMIT and holds
    the committed result."""
    t = "ops_rw"
    with ops.connect() as conn, ops.connect() as writer:
        make_table(conn, t, 2000)
        oid = val(conn, "SELECT %s::regclass::oid", (t,))
        bg = None
        try:
            base = val(conn, "SELECT gsnap_snapshot()")
            before = digest(conn, t)
            writer.execute("BEGIN")
            writer.execute(REWRITES[kind].format(t=t))
            writer.execute(f"DELETE FROM {t} WHERE id > 10")
            writer.execute(f"INSERT INTO {t} VALUES (-1, -1, 'inside the rewrite')")
            bg, told = declare_in_background(ops)
            wait_until(lambda: progress(conn)["waiting_for_table"] == oid, 10,
                       f"gsnap_progress().waiting_for_table = {t}")
            # The session is told what it waits for, once, after a second.
            wait_until(lambda: told, 10, "a NOTICE to the waiting session")
            assert told == [f"gsnap: waiting for a lock on table {t} to declare the snapshot"], told
            assert bg.is_alive(), f"gsnap_snapshot(false) returned {bg.result!r} {bg.error!r} during an open {kind}"
            assert time.monotonic() - bg.started >= 1.0, "told before the declaration had waited a second"
            committed_at = time.monotonic()
            writer.execute("COMMIT")
            bg.wait(10, "gsnap_snapshot(false) after the COMMIT")
            assert bg.error is None, bg.error
            after_commit = bg.finished - committed_at
            print(f"[ops] {kind}: declaration returned {after_commit * 1000:.0f} ms after the COMMIT")
            assert after_commit < 2.0
            snap = bg.result
            assert snap > base
            wait_settled(conn, 30)
            assert snapshot_row(conn, snap)["state"] == "committed"
            assert progress(conn)["waiting_for_table"] is None
            assert digest(conn, asof(t, snap)) == digest(conn, t)
            assert digest(conn, asof(t, snap))[0] == (1 if kind == "truncate" else 11)
            assert digest(conn, asof(t, base)) == before
        finally:
            if bg is not None:
                bg.stop()
            if writer.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                writer.execute("ROLLBACK")
            conn.execute(f"DROP TABLE IF EXISTS {t}")


@pytest.mark.parametrize("command", ["TRUNCATE", "VACUUM FULL", "DROP TABLE"])
def test_storage_replacing_commands_wait_for_the_capture(ops, command):
    """While the capture of a table is in flight, TRUNCATE / VACUUM FULL / DROP TABLE of it
    wait until the snapshot is durable (and the snapshot reads the rows it saw); ordinary
    SELECT/INSERT/UPDATE on the table do not wait."""
    t = "ops_cap"
    with ops.connect() as conn:
        make_table(conn, t, 6000)
        before = digest(conn, t)
        bg = None
        try:
            with slow_capture(conn):
                snap = val(conn, "SELECT gsnap_snapshot(false)")
                wait_capturing(conn, snap)
                lat = [measure(conn, f"UPDATE {t} SET v = v + 1 WHERE id % 1000 = 3"),
                       measure(conn, f"INSERT INTO {t} VALUES (-5, -5, 'during')"),
                       measure(conn, f"SELECT count(*) FROM {t}")]
                assert max(lat) < 1.0, lat
                bg = Bg(ops, lambda c: c.execute(f"{command} {t}"))
                wait_until(lambda: val(conn, "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted",
                                       (bg.pid,)) > 0, 10, f"{command} to wait for a lock")
                time.sleep(1.0)  # a window in which the command must go on waiting
                assert bg.is_alive(), f"{command} finished during the capture of {snap}: {bg.error!r}"
                assert in_flight(conn, snap), progress(conn)
            # the pause is lifted: the capture ends, then the command goes through
            bg.wait(30, f"{command} after the capture")
            assert bg.error is None, bg.error
            row = snapshot_row(conn, snap)
            assert row["state"] == "committed", f"{command} finished while snapshot {snap} was {row}"
            if command != "DROP TABLE":
                assert digest(conn, asof(t, snap)) == before
                after = val(conn, "SELECT gsnap_snapshot()")
                assert digest(conn, asof(t, after)) == digest(conn, t)
            else:
                tables = conn.execute("SELECT table_name, blocks FROM gsnap_snapshot_tables(%s)", (snap,)).fetchall()
                assert any(name.endswith(t) and blocks > 0 for name, blocks in tables), tables
        finally:
            if bg is not None:
                bg.stop()
            conn.execute(f"DROP TABLE IF EXISTS {t}")


# -- 4. the worker's life ------------------------------------------------------------------------


def test_worker_comes_back_after_termination(ops):
    """pg_terminate_backend(worker) -> the worker is back within ~10 s, requests made while it
    is down wait for it (bounded), committed snapshots stay readable and the first snapshot
    after the restart equals the live table."""
    t = "ops_life"
    with ops.connect() as conn:
        make_table(conn, t, 3000)
        bg = None
        try:
            s1 = val(conn, "SELECT gsnap_snapshot()")
            d1 = digest(conn, t)
            conn.execute(f"UPDATE {t} SET v = v * 2 WHERE id % 7 = 0")
            conn.execute(f"DELETE FROM {t} WHERE id % 11 = 0")
            pid0 = progress(conn)["worker_pid"]
            assert pid0
            t0 = time.monotonic()
            assert val(conn, "SELECT pg_terminate_backend(%s)", (pid0,))
            wait_until(lambda: progress(conn)["worker"] == "down", 10, "the worker to stop")
            # requests while it is down
            bg = Bg(ops, lambda c: val(c, "SELECT gsnap_snapshot()"))
            listed_at = time.monotonic()
            try:
                n = len(snapshots(conn))
                listing = ("ok", n)
            except psycopg.Error as e:
                listing = (e.sqlstate, str(e))
            listing_took = time.monotonic() - listed_at
            p = wait_ready(conn, 20, other_than=pid0)
            restart = time.monotonic() - t0
            bg.wait(25, "gsnap_snapshot() issued while the worker was down")
            print(f"[ops] worker restart: ready {restart:.1f} s after pg_terminate_backend; "
                  f"gsnap_snapshots() issued while down answered after {listing_took:.1f} s ({listing[0]}); "
                  f"gsnap_snapshot() issued while down returned after {bg.finished - bg.started:.1f} s "
                  f"({'ok' if bg.error is None else bg.error.sqlstate})")
            assert restart < 12, f"worker back after {restart:.1f} s"
            assert p["worker_pid"] != pid0
            assert listing[0] == "ok" or listing[0] == "55000" and "not running" in listing[1], listing
            assert listing_took < 20
            if bg.error is not None:
                # allowed: a clear error, never a hang
                assert bg.error.sqlstate == "55000", bg.error
                s2 = val(conn, "SELECT gsnap_snapshot()")
            else:
                s2 = bg.result
            assert digest(conn, asof(t, s1)) == d1, "a committed snapshot changed across the restart"
            assert digest(conn, asof(t, s2)) == digest(conn, t), "first snapshot after the restart"
            conn.execute(f"UPDATE {t} SET v = v + 1 WHERE id % 13 = 0")
            s3 = val(conn, "SELECT gsnap_snapshot()")
            assert digest(conn, asof(t, s3)) == digest(conn, t)
            assert digest(conn, asof(t, s1)) == d1
        finally:
            if bg is not None:
                bg.stop()
            conn.execute(f"DROP TABLE IF EXISTS {t}")


def test_a_restarted_worker_never_serves_the_old_workers_index_copies(ops):
    """The newest index group lives in shared memory as published copies that survive a
    worker restart. The restarted worker must not mistake an old copy for its own: each AS OF
    after the restart equals the live table at that snapshot."""
    t = "ops_copies"
    with ops.connect() as conn:
        make_table(conn, t, 2000)
        try:
            for i in range(6):
                conn.execute(f"UPDATE {t} SET v = v + 1 WHERE id % 5 = {i % 5}")
                s = val(conn, "SELECT gsnap_snapshot()")
                assert digest(conn, asof(t, s)) == digest(conn, t)
            pid0 = progress(conn)["worker_pid"]
            assert val(conn, "SELECT pg_terminate_backend(%s)", (pid0,))
            wait_ready(conn, 20, other_than=pid0)
            for i in range(10):
                conn.execute(f"UPDATE {t} SET v = v + 100 WHERE id % 7 = {i % 7}")
                s = val(conn, "SELECT gsnap_snapshot()")
                assert digest(conn, asof(t, s)) == digest(conn, t), \
                    f"snapshot {s}, the {i + 1}th after the restart, reads wrong"
        finally:
            conn.execute(f"DROP TABLE IF EXISTS {t}")


def test_drop_database_does_not_wait_for_the_worker(ops):
    """DROP DATABASE (of any database) waits until every process has accepted a
    ProcSignalBarrier; an idle gsnap worker must accept it promptly, or DROP DATABASE hangs
    for as long as gsnap runs."""
    with ops.connect() as conn:
        wait_ready(conn, 20)
        conn.execute("DROP DATABASE IF EXISTS ops_drop_me")
        conn.execute("CREATE DATABASE ops_drop_me")
        wait_settled(conn, 20)  # the worker idle, in its latch wait
        log_from = len(ops.log())
        pid = progress(conn)["worker_pid"]
        try:
            took = drop_database(ops, "ops_drop_me", timeout_s=10)
            print(f"[ops] DROP DATABASE took {took * 1000:.0f} ms with the gsnap worker running")
        except errors.QueryCanceled:
            log = ops.log()[log_from:]
            waiting = f"still waiting for backend with PID {pid} to accept ProcSignalBarrier" in log
            pytest.fail(f"DROP DATABASE did not finish in 10 s; the server log "
                        f"{'says' if waiting else 'does not say'} it waits for the gsnap worker "
                        f"(PID {pid}) to accept a ProcSignalBarrier")
        finally:
            wait_ready(conn, 20)


def test_worker_terminated_during_a_capture(ops):
    """A worker killed while capturing: the waiting gsnap_snapshot() gets a clear error (not a
    hang), the half-captured snapshot is never readable as if complete, the next one is
    exact."""
    t = "ops_kill"
    with ops.connect() as conn:
        make_table(conn, t, 6000)
        bg = None
        try:
            s1 = val(conn, "SELECT gsnap_snapshot()")
            d1 = digest(conn, t)
            conn.execute(f"UPDATE {t} SET v = -v")  # every page: a long capture
            with slow_capture(conn):
                bg = Bg(ops, lambda c: val(c, "SELECT gsnap_snapshot()"))
                victim = s1 + 1
                wait_capturing(conn, victim)
                pid0 = progress(conn)["worker_pid"]
                conn.execute("SELECT pg_terminate_backend(%s)", (pid0,))
                t0 = time.monotonic()
                wait_until(lambda: progress(conn)["worker"] == "down", 10, "the worker to stop")
            # leaving the block lifts the pause before the new worker starts (5 s later)
            bg.wait(25, "the gsnap_snapshot() that waited for the killed capture")
            print(f"[ops] waiter of the killed capture answered after {bg.finished - t0:.1f} s: {bg.error!r}")
            assert bg.error is not None, f"gsnap_snapshot() returned {bg.result} for a killed capture"
            assert bg.error.sqlstate == "55000" and "restarted" in str(bg.error), bg.error
            wait_ready(conn, 20, other_than=pid0)
            row = snapshot_row(conn, victim)
            assert row is None or row["state"] == "failed", row
            conn.execute("SET statement_timeout = '10s'")
            with pytest.raises(psycopg.Error) as err:
                conn.execute(f"SELECT count(*) FROM {asof(t, victim)}")
            assert not isinstance(err.value, errors.QueryCanceled), (
                f"AS OF the killed snapshot {victim} waited for a capture that will never end")
            conn.execute("RESET statement_timeout")
            assert digest(conn, asof(t, s1)) == d1
            s3 = val(conn, "SELECT gsnap_snapshot()")
            assert digest(conn, asof(t, s3)) == digest(conn, t)
        finally:
            if bg is not None:
                bg.stop()
            conn.execute("RESET statement_timeout")
            conn.execute(f"DROP TABLE IF EXISTS {t}")


def test_cancelled_asof_wait_leaves_the_session_healthy(ops):
    """gsnap_asof() of a snapshot still being captured waits; pg_cancel_backend() ends that
    wait at once and the session's next gsnap requests work."""
    t = "ops_cancel"
    with ops.connect() as conn:
        make_table(conn, t, 6000)
        before = digest(conn, t)
        bg = None
        try:
            with slow_capture(conn):
                snap = val(conn, "SELECT gsnap_snapshot(false)")
                wait_capturing(conn, snap)
                bg = Bg(ops, lambda c: val(c, f"SELECT count(*) FROM {asof(t, snap)}"))

                def waiting():  # in a gsnap wait (or returned: asserted below)
                    row = conn.execute("SELECT wait_event_type FROM pg_stat_activity"
                                       " WHERE pid = %s AND state = 'active'", (bg.pid,)).fetchone()
                    return not bg.is_alive() or (row is not None and row[0] == "Extension")
                wait_until(waiting, 10, "the AS OF query to wait for the capture")
                assert bg.is_alive(), f"AS OF a capturing snapshot returned {bg.result!r} {bg.error!r}"
                t0 = time.monotonic()
                conn.execute("SELECT pg_cancel_backend(%s)", (bg.pid,))
                bg.join(5)
                took = time.monotonic() - t0
                print(f"[ops] pg_cancel_backend of a waiting gsnap_asof: ended after {took * 1000:.0f} ms")
                assert not bg.is_alive(), "gsnap_asof ignored pg_cancel_backend"
                assert isinstance(bg.error, errors.QueryCanceled), bg.error
                # the same session, right away
                assert val(bg.conn, "SELECT count(*) FROM gsnap_snapshots()") >= 1
                assert in_flight(bg.conn, snap)
            wait_settled(conn, 60)
            assert digest(bg.conn, asof(t, snap)) == before
        finally:
            if bg is not None:
                bg.stop()
            conn.execute(f"DROP TABLE IF EXISTS {t}")


def test_cancelled_snapshot_wait_leaves_the_session_healthy(ops):
    """gsnap_snapshot() (wait for durability) cancelled by statement_timeout while its capture
    runs: the session's next gsnap requests must work right away (not only once the capture is
    over), and the snapshot itself still completes."""
    t = "ops_cancel2"
    with ops.connect() as conn, ops.connect() as other:
        make_table(conn, t, 6000)
        try:
            s0 = val(conn, "SELECT gsnap_snapshot()")  # a committed snapshot holding the table
            conn.execute(f"UPDATE {t} SET v = v + 1")  # pages for the next capture
            before = digest(conn, t)
            with slow_capture(conn):
                other.execute("SET statement_timeout = '1500ms'")
                t0 = time.monotonic()
                with pytest.raises(errors.QueryCanceled):
                    other.execute("SELECT gsnap_snapshot()")
                took = time.monotonic() - t0
                print(f"[ops] gsnap_snapshot() cancelled by statement_timeout=1.5s after {took:.2f} s")
                assert took < 3
                other.execute("SET statement_timeout = '10s'")
                snap = progress(conn)["snap_id"]
                assert in_flight(conn, snap), progress(conn)
                # the next requests of the same session, while that capture still runs
                problems = []
                for sql in ("SELECT count(*) FROM gsnap_snapshots()",
                            f"SELECT count(*) FROM {asof(t, s0)}",
                            "SELECT gsnap_snapshot(false)"):
                    try:
                        other.execute(sql).fetchall()
                    except psycopg.Error as e:
                        problems.append(f"{sql}: {e.sqlstate} {e}")
                still = progress(conn)
            wait_settled(conn, 60)
            assert snapshot_row(conn, snap)["state"] == "committed"
            assert digest(conn, asof(t, snap)) == before
            # once the capture is over, the session works again in any case
            assert val(other, "SELECT count(*) FROM gsnap_snapshots()") >= 1
            assert not problems, (
                f"after a cancelled gsnap_snapshot(), the same session's requests failed while "
                f"the capture of {snap} was still running ({still['phase']}): {problems}")
        finally:
            conn.execute(f"DROP TABLE IF EXISTS {t}")


def test_concurrent_scans_bigger_than_the_image_cache(ops):
    """Two and three sessions reading the same big table AS OF at once, each scan bigger than
    the image cache (gsnap.image_cache_size = 2MB, the smallest allowed: 256 slots), all
    finish promptly with the right rows: scans share the cache, none waits forever for slots
    another scan holds."""
    t = "ops_conc"
    wait_server(ops)
    with ops.connect() as conn:
        make_table(conn, t, 42000)  # ~1200 pages
        try:
            snap = val(conn, "SELECT gsnap_snapshot()")
            expected = val(conn, f"SELECT count(*) FROM {t}")
            assert val(conn, f"SELECT count(*) FROM {asof(t, snap)}") == expected
            for n in (2, 3):
                t0 = time.monotonic()
                bgs = [Bg(ops, lambda c: val(c, f"SELECT count(*) FROM {asof(t, snap)}"),
                          options="-c statement_timeout=8s") for _ in range(n)]
                try:
                    for b in bgs:
                        b.wait(25, "a concurrent AS OF scan")
                    took = time.monotonic() - t0
                    print(f"[ops] {n} concurrent AS OF scans of a table bigger than the image cache: "
                          f"{took:.1f} s, {[repr(b.error) if b.error else b.result for b in bgs]}")
                    for b in bgs:
                        assert b.error is None, (
                            f"{n} concurrent AS OF scans: {b.error!r} (statement_timeout = 8s; one "
                            f"scan alone takes well under a second)")
                        assert b.result == expected
                finally:
                    for b in bgs:
                        b.stop()
        finally:
            conn.execute(f"DROP TABLE IF EXISTS {t}")


def test_cancelled_scans_leak_no_cache_pins(ops):
    """AS OF scans cancelled at random points (statement_timeout) leave no pinned image-cache
    slots behind: a scan bigger than the cache (gsnap.image_cache_size = 2MB, 256 slots)
    then still completes, repeatedly and concurrently."""
    t = "ops_pins"
    wait_server(ops)
    with ops.connect() as conn:
        make_table(conn, t, 42000)  # ~1200 pages, several times the cache
        try:
            pages = val(conn, f"SELECT pg_relation_size('{t}') / 8192")
            assert pages > 800, pages
            snap = val(conn, "SELECT gsnap_snapshot()")
            expected = digest(conn, t)
            assert digest(conn, asof(t, snap)) == expected
            full = 1e9
            for _ in range(2):  # the statement cancelled below
                t0 = time.monotonic()
                assert val(conn, f"SELECT count(*) FROM {asof(t, snap)}") == expected[0]
                full = min(full, time.monotonic() - t0)
            cancelled = 0
            problems = []
            log_from = len(ops.log())
            for i in range(30):
                ms = max(1, int(full * 1000 * (i + 1) / 32))
                conn.execute(f"SET statement_timeout = {ms}")
                try:
                    conn.execute(f"SELECT count(*) FROM {asof(t, snap)}").fetchall()
                except errors.QueryCanceled:
                    cancelled += 1
                except psycopg.OperationalError as e:
                    def crash_lines():
                        return [line for line in ops.log()[log_from:].splitlines()
                                if "terminated by signal" in line or "double free" in line
                                or "corrupt" in line or "PANIC" in line]
                    try:  # the postmaster logs the crash a moment after the client saw it
                        crash = wait_until(crash_lines, 5, "the server log to report the crash")
                    except AssertionError:
                        crash = []
                    pytest.fail(f"the backend died during the {i + 1}th AS OF scan cancelled by "
                                f"statement_timeout = {ms} ms ({e}); server log: {crash}")
                except errors.InternalError_ as e:
                    # "the request slot was idle": the next request after a cancelled one
                    # can fail (timing-dependent); test_cancelled_snapshot_wait_... shows
                    # that bug deterministically, here we only count it and go on
                    if "request slot" not in str(e):
                        raise
                    problems.append(f"AS OF scan after a cancelled one: {e.sqlstate} {e}")
                finally:
                    reset_timeout(conn)
            print(f"[ops] pins: full AS OF scan of {pages} pages {full * 1000:.0f} ms; "
                  f"{cancelled}/30 scans cancelled part way; {len(problems)} failed otherwise")
            assert cancelled >= 5, "too few scans were cancelled to test anything"
            # the same for range scans (over three snapshots, so through the version cache)
            conn.execute(f"UPDATE {t} SET v = v + 1 WHERE id % 50 = 0")
            snap2 = val(conn, "SELECT gsnap_snapshot()")
            conn.execute(f"UPDATE {t} SET v = v + 1 WHERE id % 70 = 0")
            snap3 = val(conn, "SELECT gsnap_snapshot()")
            # (periodic snapshots of other tests may fall in between: count them)
            range_sql = (f"SELECT count(*) = {expected[0]} * count(DISTINCT snap_id) "
                         f"AND count(DISTINCT snap_id) >= 3 FROM gsnap_range(NULL::{t}, {snap}, {snap3})")
            t0 = time.monotonic()
            assert val(conn, range_sql)
            full_range = time.monotonic() - t0
            range_cancelled = cancelled_part_way(conn, range_sql, 15, full_range)
            print(f"[ops] pins: {range_cancelled}/15 range scans cancelled part way")
            assert range_cancelled >= 3, "too few range scans were cancelled to test anything"
            worker_caught_up(conn)  # it has freed what the cancelled requests left
            conn.execute("SET statement_timeout = '30s'")
            for _ in range(3):
                assert digest(conn, asof(t, snap)) == expected
                assert val(conn, range_sql)
            assert snap < snap2 < snap3
            if problems:
                print(f"[ops] pins: {len(problems)} requests failed right after a cancelled one: "
                      f"{problems[0]}")
        finally:
            reset_timeout(conn)
            conn.execute(f"DROP TABLE IF EXISTS {t}")

