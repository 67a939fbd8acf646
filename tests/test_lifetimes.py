"""Lifetimes (issue 7): sparse deletion, background reclamation, retention policies, ranks,
pins and the size cap, on a real server.

The differential tests record what every snapshot reads (AS OF, range, diff) before a
deletion and check that each retained snapshot still reads exactly that after its neighbours
were deleted and their space reclaimed, also when the worker is killed in the middle of
reclaiming, and when a query was reading a snapshot while it was deleted."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time

import psycopg
import pytest

from cluster import PGBIN, gsnap_cluster
from workload import wait_worker_ready, worker_restarted
from ops_helpers import (asof, configure, digest, progress, snapshot_row, snapshots, val,
                         wait_until)


def lifetimes_cluster(name: str):
    """A cluster where reclamation starts as soon as a snapshot is deleted."""
    yield from gsnap_cluster(name, ["gsnap.reclaim_delay = 0", "autovacuum = off"])


@pytest.fixture(scope="module")
def lt():
    """This module's cluster."""
    yield from lifetimes_cluster("lifetimes")


def stats(conn) -> dict:
    cur = conn.execute("SELECT * FROM gsnap_store_stats()")
    return dict(zip([d.name for d in cur.description], cur.fetchone()))


def verify(conn, repair: bool = False) -> dict:
    cur = conn.execute("SELECT * FROM gsnap_verify(%s)", (repair,))
    return dict(zip([d.name for d in cur.description], cur.fetchone()))


def assert_clean(conn):
    v = verify(conn)
    bad = {k: v[k] for k in ("leaked_images", "leaked_toast_values", "missing_images",
                             "missing_toast_values", "wrong_counts") if v[k]}
    assert not bad, f"gsnap_verify() found damage: {v}"


def states(conn) -> dict[int, str]:
    return {s["snap_id"]: s["state"] for s in snapshots(conn)}


def wait_reclaimed(conn, snaps, timeout: float = 60):
    """Waits until every snapshot of `snaps` is reclaimed and nothing deleted waits."""
    def done():
        st = states(conn)
        return all(st.get(s) == "reclaimed" for s in snaps) and stats(conn)["deleted_unreclaimed"] == 0
    wait_until(done, timeout, f"snapshots {sorted(snaps)} to be reclaimed", interval=0.1)


def churn(conn, table: str, rng: random.Random, rows: int):
    """Random updates, deletes and inserts (some TOASTed), about 5% of the rows."""
    for _ in range(3):
        lo = rng.randrange(1, rows)
        conn.execute(f"UPDATE {table} SET v = v + 1, pad = md5(random()::text) "
                     f"WHERE id BETWEEN %s AND %s", (lo, lo + rows // 60))
    lo = rng.randrange(1, rows)
    conn.execute(f"DELETE FROM {table} WHERE id BETWEEN %s AND %s", (lo, lo + rows // 200))
    top = val(conn, f"SELECT coalesce(max(id), 0) FROM {table}")
    conn.execute(f"INSERT INTO {table} SELECT g, g, repeat(md5(g::text), %s) "
                 f"FROM generate_series(%s::int, %s::int) g", (rng.choice([1, 6, 300]), top + 1, top + 20))


def make(conn, table: str, rows: int):
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int, pad text) USING gsnap")
    conn.execute(f"INSERT INTO {table} SELECT g, g, repeat(md5(g::text), 6) "
                 f"FROM generate_series(1, {rows}) g")


def take(conn, n: int, table: str, rng: random.Random, rows: int) -> list[int]:
    snaps = []
    for _ in range(n):
        churn(conn, table, rng, rows)
        snaps.append(val(conn, "SELECT gsnap_snapshot()"))
    return snaps


def record(conn, table: str, snaps: list[int]) -> dict:
    """What each snapshot reads, by AS OF and by diff against the next one."""
    out = {("asof", s): digest(conn, asof(table, s)) for s in snaps}
    for a, b in zip(snaps, snaps[1:]):
        out[("diff", a, b)] = digest(conn, f"gsnap_diff(NULL::{table}, {a}, {b})")
    return out


def check_retained(conn, table: str, kept: list[int], recorded: dict):
    for s in kept:
        assert digest(conn, asof(table, s)) == recorded[("asof", s)], f"AS OF {s} changed"
    for a, b in zip(kept, kept[1:]):
        if ("diff", a, b) in recorded:
            assert digest(conn, f"gsnap_diff(NULL::{table}, {a}, {b})") == recorded[("diff", a, b)]
    # The range reads exactly the retained snapshots' rows.
    rows = conn.execute(
        f"SELECT snap_id, count(*) FROM gsnap_range(NULL::{table}, %s, %s) GROUP BY 1 ORDER BY 1",
        (kept[0], kept[-1])).fetchall()
    assert [r[0] for r in rows] == kept
    assert [r[1] for r in rows] == [recorded[("asof", s)][0] for s in kept]


def test_sparse_deletions_leave_every_retained_snapshot_reading_the_same(lt):
    rng = random.Random(7)
    with lt.connect() as conn:
        make(conn, "lt_sparse", 6000)
        snaps = take(conn, 14, "lt_sparse", rng, 6000)
        recorded = record(conn, "lt_sparse", snaps)
        before = stats(conn)
        deleted: set[int] = set()
        for round_ in range(3):
            candidates = [s for s in snaps[:-1] if s not in deleted]
            victims = rng.sample(candidates, 3)
            t = time.monotonic()
            n = val(conn, "SELECT gsnap_delete(%s::bigint[])", (victims,))
            elapsed = time.monotonic() - t
            assert n == 3
            assert elapsed < 1.0, f"a logical delete took {elapsed:.3f} s"
            deleted.update(victims)
            # Deleted snapshots are unreadable at once, before any reclamation.
            for s in victims:
                with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="was deleted"):
                    conn.execute(f"SELECT count(*) FROM {asof('lt_sparse', s)}")
            wait_reclaimed(conn, deleted)
            kept = [s for s in snaps if s not in deleted]
            check_retained(conn, "lt_sparse", kept, recorded)
            assert_clean(conn)
        after = stats(conn)
        assert after["reclaimed_images"] > 0 and after["reclaimed_bytes"] > 0
        assert after["images"] < before["images"]
        # AS OF by time picks the newest retained snapshot at or before the time.
        listed = {s["snap_id"]: s for s in snapshots(conn)}
        gone = sorted(s for s in deleted if s > min(kept))
        s = gone[0]
        expected = max(k for k in kept if k < s)
        got = digest(conn, f"gsnap_asof(NULL::lt_sparse, '{listed[s]['taken_at'].isoformat()}'::timestamptz)")
        assert got == recorded[("asof", expected)]


def test_killing_the_server_while_it_reclaims_loses_nothing_and_leaks_nothing(lt):
    """20 kill -9s during reclamation, of the postmaster (and every child) and of the worker
    alone in turn, at random points of the steps: reclamation resumes where it was, retained
    snapshots read exactly what they did, and verify finds nothing leaked or missing."""
    rng = random.Random(11)
    with lt.connect() as conn:
        make(conn, "lt_kill", 20000)
        snaps = take(conn, 6, "lt_kill", rng, 20000)
        # Snapshots whose pages nobody else holds: every page rewritten in each of them.
        for _ in range(3):
            conn.execute("UPDATE lt_kill SET v = v + 1")
            snaps.append(val(conn, "SELECT gsnap_snapshot()"))
        snaps.append(take(conn, 1, "lt_kill", rng, 20000)[0])
        recorded = record(conn, "lt_kill", snaps)
        configure(conn, reclaim_batch=8, debug_reclaim_pause_ms=40)
        victims = [snaps[1], snaps[3], snaps[6], snaps[7]]
        conn.execute("SELECT gsnap_delete(%s::bigint[])", (victims,))
    kills = 0
    seen_steps = set()
    while kills < 20:
        with lt.connect() as conn:
            p = wait_until(lambda: (lambda p: p["reclaiming_snap"] is not None and p)(progress(conn))
                           or states(conn).keys() and all(states(conn)[v] == "reclaimed" for v in victims),
                           30, "a reclamation in flight")
            if p is True:
                break
            seen_steps.add((p["reclaiming_snap"], p["reclaim_done"]))
            pid = p["worker_pid"]
        time.sleep(rng.uniform(0.0, 0.15))
        if kills % 2 == 0:
            lt.crash()  # kill -9 of the postmaster and every child, as a power cut would
            lt.start()
        else:
            lt.kill(pid, signal.SIGKILL)  # the worker alone: the postmaster restarts everything
        kills += 1
        wait_until(lambda: worker_restarted(lt, pid), 60, "the server to restart after the kill",
                   interval=0.2)
    assert kills == 20, f"reclamation finished after only {kills} kills: make it slower"
    assert len(seen_steps) >= 10, f"the kills hit too few distinct points: {seen_steps}"
    with lt.connect() as conn:
        configure(conn, reclaim_batch=None, debug_reclaim_pause_ms=None)
        wait_reclaimed(conn, victims, timeout=120)
        kept = [s for s in snaps if s not in victims]
        check_retained(conn, "lt_kill", kept, recorded)
        assert_clean(conn)


def test_a_query_reading_a_snapshot_when_it_is_deleted_finishes_correctly(lt):
    """A streaming scan (the custom scan, read through a cursor) holds a lease on its
    snapshot: the deletion is immediate for new queries, reclamation waits for the scan."""
    rng = random.Random(3)
    with lt.connect() as conn, lt.connect() as admin:
        make(conn, "lt_lease", 8000)
        snaps = take(conn, 3, "lt_lease", rng, 8000)
        conn.execute("UPDATE lt_lease SET v = v + 1")
        snaps.append(val(conn, "SELECT gsnap_snapshot()"))
        target = snaps[1]
        expected = sorted(conn.execute(f"SELECT * FROM {asof('lt_lease', target)}").fetchall())
        plan = "\n".join(r[0] for r in conn.execute(
            f"EXPLAIN SELECT * FROM {asof('lt_lease', target)}").fetchall())
        assert "Custom Scan" in plan, plan
        conn.autocommit = False
        cur = conn.cursor("reader")
        cur.execute(f"SELECT * FROM {asof('lt_lease', target)}")
        first = cur.fetchmany(100)
        assert admin.execute("SELECT gsnap_delete(%s)", (target,)).fetchone()[0] == 1
        # New reads are refused at once; the open cursor goes on reading.
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="was deleted"):
            admin.execute(f"SELECT count(*) FROM {asof('lt_lease', target)}")
        time.sleep(1.0)  # reclamation is due now (reclaim_delay = 0) but leased
        assert snapshot_row(admin, target)["state"] == "deleted"
        rest = cur.fetchall()
        conn.rollback()
        conn.autocommit = True
        assert sorted(first + rest) == expected
        wait_reclaimed(admin, [target])
        assert_clean(admin)


def test_pgbench_runs_through_deletions_and_reclamation(lt):
    with lt.connect() as conn:
        env = {"PGOPTIONS": "-c default_table_access_method=gsnap"}
        lt.run("pgbench", "-i", "-q", "-s", "2", "--no-vacuum", env=env)
        snaps = []
        bench = subprocess.Popen(
            [str(PGBIN / "pgbench"), "-n", "-c", "4", "-T", "8"],
            env={**lt.env(), **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(8):
                time.sleep(0.4)
                snaps.append(val(conn, "SELECT gsnap_snapshot()"))
            victims = snaps[:-2:2]
            conn.execute("SELECT gsnap_delete(%s::bigint[])", (victims,))
            out, err = bench.communicate(timeout=60)
        finally:
            if bench.poll() is None:
                bench.kill()
        assert bench.returncode == 0, err
        assert "number of failed transactions: 0" in out or "failed" not in out, out
        wait_reclaimed(conn, victims)
        kept = [s for s in snaps if s not in victims]
        for s in kept:
            assert val(conn, f"SELECT count(*) FROM {asof('pgbench_accounts', s)}") == 200000
        assert_clean(conn)


BAD_INPUT = [
    ("SELECT gsnap_delete(NULL::bigint[])", "22004", "snapshot ids"),
    ("SELECT gsnap_delete(ARRAY[1, NULL]::bigint[])", "22004", "snapshot id"),
    ("SELECT gsnap_delete(987654321)", "22023", "does not exist"),
    ("SELECT gsnap_delete(-1)", "22023", None),
    ("SELECT gsnap_pin(NULL, 'x')", "22004", None),
    ("SELECT gsnap_pin({s}, NULL)", "22004", "tag"),
    ("SELECT gsnap_pin({s}, '')", "22023", "must not be empty"),
    ("SELECT gsnap_pin({s}, repeat('x', 300))", "22023", "longer than"),
    ("SELECT gsnap_pin({s}, E'a\\nb')", "22023", "control characters"),
    ("SELECT gsnap_pin({s}, 'x', '-infinity')", "22023", "-infinity"),
    ("SELECT gsnap_pin({s}, 'x', NULL)", "22004", "infinity"),
    ("SELECT gsnap_pin(987654321, 'x')", "22023", "does not exist"),
    ("SELECT gsnap_unpin({s}, NULL)", "22004", "tag"),
    ("SELECT gsnap_set_rank({s}, 'fortnightly')", "22023", "is not a snapshot rank"),
    ("SELECT gsnap_set_rank({s}, NULL)", "22004", "rank"),
    ("SELECT gsnap_snapshot(rank => 'sometimes')", "22023", "is not a snapshot rank"),
    ("SELECT gsnap_snapshot(label => '')", "22023", "must not be empty"),
    ("SELECT * FROM gsnap_retention_preview('hourly=-3')", "22023", None),
    ("SELECT * FROM gsnap_retention_preview('fortnightly=3')", "22023", None),
    ("SELECT * FROM gsnap_retention_preview('within=soon')", "22023", None),
]


@pytest.mark.parametrize("sql,sqlstate,fragment", BAD_INPUT, ids=[b[0] for b in BAD_INPUT])
def test_bad_arguments_get_a_clear_error(lt, sql, sqlstate, fragment):
    with lt.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS lt_bad (id int) USING gsnap")
        s = val(conn, "SELECT max(snap_id) FROM gsnap_snapshots() WHERE state = 'committed'")
        if s is None:
            s = val(conn, "SELECT gsnap_snapshot()")
        with pytest.raises(psycopg.Error) as raised:
            conn.execute(sql.format(s=s))
        assert raised.value.sqlstate == sqlstate, (sql, raised.value)
        if fragment:
            assert fragment in str(raised.value), (sql, str(raised.value))


def test_pins_the_newest_and_all_are_protected(lt):
    with lt.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS lt_pin (id int) USING gsnap")
        a, b, c = (val(conn, "SELECT gsnap_snapshot()") for _ in range(3))
        conn.execute("SELECT gsnap_pin(%s, 'audit-2026')", (a,))
        conn.execute("SELECT gsnap_pin(%s, 'legal')", (a,))
        assert sorted(snapshot_row(conn, a)["pinned_by"]) == ["audit-2026", "legal"]
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as raised:
            conn.execute("SELECT gsnap_delete(ARRAY[%s, %s]::bigint[])", (a, b))
        assert "audit-2026" in str(raised.value) and "legal" in str(raised.value)
        # all or nothing: b was not deleted either
        assert snapshot_row(conn, b)["state"] == "committed"
        with pytest.raises(psycopg.Error, match="newest") as raised:
            conn.execute("SELECT gsnap_delete(%s)", (c,))
        assert raised.value.sqlstate == "55000"
        conn.execute("SELECT gsnap_unpin(%s, 'audit-2026')", (a,))
        conn.execute("SELECT gsnap_unpin(%s, 'legal')", (a,))
        with pytest.raises(psycopg.Error, match="not pinned|no pin"):
            conn.execute("SELECT gsnap_unpin(%s, 'legal')", (a,))
        assert val(conn, "SELECT gsnap_delete(ARRAY[%s, %s]::bigint[])", (a, b)) == 2
        # Deleting it again is a no-op with a NOTICE.
        notices = []
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        assert val(conn, "SELECT gsnap_delete(%s)", (a,)) == 0
        assert any("already deleted" in n for n in notices), notices
        assert val(conn, "SELECT gsnap_delete(%s, force => true)", (c,)) == 1


def test_administration_is_refused_to_roles_without_gsnap_admin(lt):
    with lt.connect() as conn:
        conn.execute("DROP ROLE IF EXISTS lt_user")
        conn.execute("CREATE ROLE lt_user LOGIN")
        conn.execute("CREATE TABLE IF NOT EXISTS lt_priv (id int) USING gsnap")
        s = val(conn, "SELECT gsnap_snapshot()")
    with lt.connect(user="lt_user") as user:
        for sql in (f"SELECT gsnap_delete({s})", f"SELECT gsnap_delete(ARRAY[{s}]::bigint[])",
                    f"SELECT gsnap_pin({s}, 'mine')", f"SELECT gsnap_unpin({s}, 'mine')",
                    f"SELECT gsnap_set_rank({s}, 'daily')", "SELECT * FROM gsnap_verify()",
                    "SELECT gsnap_snapshot(label => 'x')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                user.execute(sql)
    with lt.connect() as conn:
        assert snapshot_row(conn, s)["state"] == "committed"
        assert not snapshot_row(conn, s)["pinned_by"]


def test_the_worker_does_exactly_what_the_preview_showed(lt):
    with lt.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS lt_policy (id int) USING gsnap")
        mine = []
        for i in range(6):
            conn.execute("INSERT INTO lt_policy VALUES (%s)", (i,))
            mine.append(val(conn, "SELECT gsnap_snapshot()"))
            time.sleep(0.3)
        conn.execute("SELECT gsnap_set_rank(%s, 'daily')", (mine[2],))
        conn.execute("SELECT gsnap_pin(%s, 'keep-me')", (mine[1],))
        policy = "within=1s minutely=1"
        preview = {r[0]: (r[1], r[2]) for r in conn.execute(
            "SELECT snap_id, action, rule FROM gsnap_retention_preview(%s)", (policy,))}
        assert preview[mine[1]] == ("keep", "pinned")
        assert preview[mine[-1]][0] == "keep"
        to_delete = {s for s, (action, _) in preview.items() if action == "delete"}
        assert to_delete, f"the policy deletes nothing: {preview}"
        assert mine[2] not in to_delete, "a daily snapshot is kept by minutely=1's bucket or rank"
        try:
            configure(conn, retention=policy, min_snapshots=1)
            wait_reclaimed(conn, to_delete)
            st = states(conn)
            gone = {s for s, state in st.items() if state in ("deleted", "reclaimed")}
            previously_gone = {s for s in gone if s not in preview}
            assert gone - previously_gone == to_delete
        finally:
            configure(conn, retention=None, min_snapshots=None)
            conn.execute("SELECT gsnap_unpin(%s, 'keep-me')", (mine[1],))


def test_an_expired_pin_no_longer_protects(lt):
    with lt.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS lt_expire (id int) USING gsnap")
        old = val(conn, "SELECT gsnap_snapshot()")
        conn.execute("SELECT gsnap_pin(%s, 'short', now() + interval '3 seconds')", (old,))
        time.sleep(1.2)
        for _ in range(2):
            val(conn, "SELECT gsnap_snapshot()")
        assert val(conn, "SELECT action FROM gsnap_retention_preview('within=1s') "
                         "WHERE snap_id = %s", (old,)) == "keep"
        try:
            configure(conn, retention="within=1s", min_snapshots=1)
            time.sleep(0.5)
            assert snapshot_row(conn, old)["state"] == "committed"
            wait_until(lambda: snapshot_row(conn, old)["state"] in ("deleted", "reclaimed"),
                       30, "the snapshot to be deleted once its pin expired")
        finally:
            configure(conn, retention=None, min_snapshots=None)


def test_the_size_cap_thins_unpinned_snapshots_and_warns_when_it_cannot(lt):
    with lt.connect() as conn:
        make(conn, "lt_cap", 30000)
        snaps = []
        for _ in range(5):
            conn.execute("UPDATE lt_cap SET v = v + 1")
            snaps.append(val(conn, "SELECT gsnap_snapshot()"))
        conn.execute("SELECT gsnap_pin(%s, 'cap-test')", (snaps[0],))
        log_before = len(lt.log())
        try:
            configure(conn, max_store_size="1MB")
            wait_until(lambda: all(states(conn)[s] in ("deleted", "reclaimed") for s in snaps[1:-1]),
                       60, "the cap to delete the unpinned, not newest snapshots")
            st = states(conn)
            assert st[snaps[0]] == "committed", "a pinned snapshot was deleted by the cap"
            assert st[snaps[-1]] == "committed", "the newest snapshot was deleted by the cap"
            wait_until(lambda: "WARNING" in lt.log()[log_before:] and "max_store_size" in lt.log()[log_before:],
                       30, "a WARNING that the cap cannot be met")
        finally:
            configure(conn, max_store_size=None)
            conn.execute("SELECT gsnap_unpin(%s, 'cap-test')", (snaps[0],))


def test_the_listing_says_what_deleting_a_snapshot_frees_and_it_does(lt):
    """gsnap_snapshots().frees_bytes (computed in the background) is exactly what reclaiming
    that snapshot alone then frees; the newest snapshot shows none."""
    rng = random.Random(5)
    with lt.connect() as conn:
        make(conn, "lt_frees", 6000)
        snaps = take(conn, 2, "lt_frees", rng, 6000)
        conn.execute("UPDATE lt_frees SET pad = md5(pad) WHERE id % 3 = 0")
        snaps.append(val(conn, "SELECT gsnap_snapshot()"))
        snaps += take(conn, 2, "lt_frees", rng, 6000)
        target = snaps[2]

        def known():
            rows = {s["snap_id"]: s["frees_bytes"] for s in snapshots(conn)}
            return rows if all(rows[s] is not None for s in snaps[:-1]) else None

        rows = wait_until(known, 30, "every estimate to be computed")
        assert rows[snaps[-1]] is None, "the newest snapshot cannot be reclaimed"
        assert rows[target] > 0, rows
        before = stats(conn)["reclaimed_bytes"]
        configure(conn, reclaim_delay="1h")  # hold reclamation back to see the summary
        try:
            conn.execute("SELECT gsnap_delete(%s)", (target,))
            wait_until(lambda: stats(conn)["deleted_bytes"] == rows[target], 30,
                       "the store summary to count the deleted snapshot's bytes")
        finally:
            configure(conn, reclaim_delay=None)
        wait_reclaimed(conn, [target])
        assert stats(conn)["reclaimed_bytes"] - before == rows[target]
        assert_clean(conn)


def test_estimates_kept_from_snapshot_to_snapshot_and_across_restarts(lt):
    """After a commit the worker recomputes only the estimate of the snapshot that was newest
    before it, unless the capture referenced older content (then all of them), after a
    capture of new content and after one whose new table repeats an older snapshot's pages
    (its images gain references, so what deleting that snapshot would free shrinks). The
    store keeps the estimates too: after the worker is killed, and after a clean restart of
    the server, the first listing already shows every one of them, as they were, instead of
    a read of each snapshot's dead mappings and counts first."""
    def listing():
        return {s["snap_id"]: s["frees_bytes"] for s in snapshots(conn)}

    def all_known(snaps):
        def check():
            rows = listing()
            return rows if all(rows[s] is not None for s in snaps[:-1]) else None
        return wait_until(check, 30, "every estimate to be computed")

    with lt.connect() as conn:
        make(conn, "lt_est_a", 4000)
        conn.execute("DROP TABLE IF EXISTS lt_est_b")
        snaps = [val(conn, "SELECT gsnap_snapshot()")]
        conn.execute("UPDATE lt_est_a SET pad = md5(pad) WHERE id % 2 = 0")
        snaps.append(val(conn, "SELECT gsnap_snapshot()"))
        first = all_known(snaps)[snaps[0]]
        assert first > 0, "the first snapshot's pages were all replaced: deleting it frees them"
        # New content only: the previous newest snapshot gets its estimate, the rest stand.
        conn.execute("UPDATE lt_est_a SET pad = md5(pad) WHERE id % 5 = 0")
        snaps.append(val(conn, "SELECT gsnap_snapshot()"))
        assert all_known(snaps)[snaps[0]] == first
        # Pages emptied, twice: the second time they map the empty page's image, which the
        # previous page table names (no older estimate changes).
        for upto in (300, 600):
            conn.execute("DELETE FROM lt_est_a WHERE id <= %s", (upto,))
            conn.execute("VACUUM lt_est_a")
            snaps.append(val(conn, "SELECT gsnap_snapshot()"))
            all_known(snaps)
        # A new table with the first snapshot's pages, row for row: its capture maps the first
        # snapshot's images, which deleting that snapshot then no longer frees.
        conn.execute("CREATE TABLE lt_est_b (LIKE lt_est_a) USING gsnap")
        conn.execute(f"INSERT INTO lt_est_b SELECT * FROM {asof('lt_est_a', snaps[0])}")
        snaps.append(val(conn, "SELECT gsnap_snapshot()"))
        kept = all_known(snaps)
        assert kept[snaps[0]] < first, (kept[snaps[0]], first)
        pid = progress(conn)["worker_pid"]
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_until(lambda: worker_restarted(lt, pid), 60, "the worker to restart")

    def first_listing():
        first = listing()
        assert {s: first[s] for s in snaps} == {s: kept[s] for s in snaps}, first

    with lt.connect() as conn:
        first_listing()
        assert all_known(snaps) == kept
    lt.restart()
    wait_worker_ready(lt)
    with lt.connect() as conn:
        first_listing()


def test_after_a_reclamation_only_the_neighbours_estimates_change_and_each_is_exact(lt):
    """Reclaiming a snapshot makes the worker recompute the estimates of its two neighbours
    only (their dead mappings grow), unless the reclamation left content it released named
    elsewhere. Each estimate shown afterwards is exactly what reclaiming that snapshot then
    frees: a neighbour's (recomputed) and one further away (kept as it was through two
    reclamations)."""
    rng = random.Random(23)

    def listing():
        return {s["snap_id"]: s["frees_bytes"] for s in snapshots(conn)}

    def recomputed(live, grown, old):
        """The listing once every estimate of `live` is known and that of `grown`, the
        reclaimed snapshot's upper neighbour, moved from `old` (its dead mappings grew here).
        The thread computes stale estimates in snapshot order, so the lower neighbour's was
        recomputed by then too."""
        def check():
            rows = listing()
            if any(rows.get(s) is None for s in live[:-1]):
                return None
            return rows if grown is None or rows[grown] != old[grown] else None
        return wait_until(check, 60, f"the estimate of {grown} to be recomputed")

    def reclaim(snap, shown):
        before = stats(conn)["reclaimed_bytes"]
        conn.execute("SELECT gsnap_delete(%s)", (snap,))
        wait_reclaimed(conn, [snap])
        assert stats(conn)["reclaimed_bytes"] - before == shown[snap], (snap, shown)

    with lt.connect() as conn:
        make(conn, "lt_after", 6000)
        s = take(conn, 7, "lt_after", rng, 6000)
        live = list(s)
        rows = recomputed(live, None, {})
        reclaim(s[2], rows)
        live.remove(s[2])
        rows2 = recomputed(live, s[3], rows)
        assert rows2[s[3]] > rows[s[3]], (rows, rows2)
        assert rows2[s[5]] == rows[s[5]]
        reclaim(s[3], rows2)  # the upper neighbour, recomputed
        live.remove(s[3])
        rows3 = recomputed(live, s[4], rows2)
        reclaim(s[5], rows3)  # further away: the value it had before both reclamations
        assert rows3[s[5]] == rows[s[5]]
        live.remove(s[5])
        rows4 = recomputed(live, s[4], rows3)
        reclaim(s[1], rows4)  # the lower neighbour of s2 and of s3, recomputed twice
        assert_clean(conn)


def thread_nices(pid: int) -> dict[str, set[int]]:
    """The nice value of each thread of process `pid`, by thread name."""
    out: dict[str, set[int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        # Fields after the name (which may hold spaces) start at field 3; nice is field 19.
        nice = int(stat[stat.rindex(")") + 2:].split()[16])
        out.setdefault("main" if tid == str(pid) else comm, set()).add(nice)
    return out


def test_background_work_takes_the_cpu_the_backends_leave(lt):
    """The estimates' thread and RocksDB's compaction threads run at nice 19, so that on a
    busy machine they take the CPU the backends and the capture leave instead of theirs (an
    estimate competing with a capture's phase one held its MVCC snapshot 1.5-3x longer under
    pgbench). The worker's main thread, phase two's thread and RocksDB's flush thread keep
    their priority: a capture and a declaration are waited for."""
    rng = random.Random(31)
    with lt.connect() as conn:
        pid = progress(conn)["worker_pid"]
        make(conn, "lt_nice", 6000)
        seen: dict[str, set[int]] = {}
        stop = threading.Event()

        def poll():
            while not stop.is_set():
                for name, nices in thread_nices(pid).items():
                    seen.setdefault(name, set()).update(nices)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            deadline = time.monotonic() + 60
            snaps = []
            while time.monotonic() < deadline:
                snaps += take(conn, 1, "lt_nice", rng, 6000)
                snapshots(conn)  # the listing wants the estimates
                if len(snaps) % 4 == 0:
                    # A reclamation compacts the freed ranges (RocksDB's compaction threads).
                    conn.execute("SELECT gsnap_delete(%s)", (snaps[-4],))
                    wait_reclaimed(conn, [snaps[-4]])
                # Estimates are computed once the catalog is quiet for a second.
                time.sleep(1.5)
                if 19 in seen.get("gsnap-frees", ()) and 19 in seen.get("rocksdb:low", ()):
                    break
        finally:
            stop.set()
            poller.join()
    assert 19 in seen.get("gsnap-frees", ()), seen
    assert 19 in seen.get("rocksdb:low", ()), seen
    for name in ("main", "gsnap-store", "rocksdb:high"):
        assert seen.get(name, {0}) == {0}, (name, seen)
    assert "main" in seen and "rocksdb:high" in seen, seen


def test_deleting_the_first_snapshot_of_a_period_says_what_it_means_for_the_policy(lt):
    with lt.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS lt_first (id int) USING gsnap")
        ranked = val(conn, "SELECT gsnap_snapshot(rank => 'daily')")
        plain = val(conn, "SELECT gsnap_snapshot()")
        val(conn, "SELECT gsnap_snapshot()")
        notices = []
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        try:
            configure(conn, retention="within=1d daily=7")
            conn.execute("SELECT gsnap_delete(%s)", (ranked,))
            assert any(f"snapshot {ranked} was the first of its daily period" in n
                       for n in notices), notices
            notices.clear()
            if snapshot_row(conn, plain)["rank"] == "none":
                conn.execute("SELECT gsnap_delete(%s)", (plain,))
                assert not any("first of its" in n for n in notices), notices
        finally:
            configure(conn, retention=None)


@pytest.fixture
def fresh():
    """A cluster of its own: what its log holds is only this test's."""
    yield from lifetimes_cluster("lifetimes-log")


def test_the_mapping_log_drops_what_no_retained_snapshot_needs(fresh):
    """Reclamation kills mappings; once they are half the log, the worker rewrites the log
    without them (one atomic batch), so under a policy the log follows the retained
    snapshots, not every snapshot ever taken. Retained snapshots read the same before and
    after, and after a restart."""
    lt = fresh
    rng = random.Random(11)
    rewritten = re.compile(r"mapping log rewritten without the mappings no retained snapshot "
                           r"needs: (\d+) mappings, (\d+) before")
    with lt.connect() as conn:
        make(conn, "lt_log", 20000)
        snaps = []
        for i in range(16):
            conn.execute("UPDATE lt_log SET v = v + 1")  # every page gets a new mapping
            churn(conn, "lt_log", rng, 20000)
            snaps.append(val(conn, "SELECT gsnap_snapshot()"))
        recorded = record(conn, "lt_log", snaps)
        kept = snaps[::5] + ([snaps[-1]] if snaps[-1] not in snaps[::5] else [])
        doomed = [s for s in snaps if s not in kept]
        seen = len(rewritten.findall(lt.log()))
        val(conn, "SELECT gsnap_delete(%s::bigint[])", (doomed,))
        wait_reclaimed(conn, doomed)
        wait_until(lambda: len(rewritten.findall(lt.log())) > seen, 60, "the mapping log to be rewritten")
        after, before = map(int, rewritten.findall(lt.log())[-1])
        # 16 snapshots of ~700 pages each, 4 kept: well under half of the mappings stay
        assert after < before / 2, (after, before)
        check_retained(conn, "lt_log", kept, recorded)
        assert_clean(conn)
    lt.restart()
    with lt.connect() as conn:
        check_retained(conn, "lt_log", kept, recorded)
        assert_clean(conn)
        # the log goes on from the rewritten one
        conn.execute("UPDATE lt_log SET v = v + 1")
        s = val(conn, "SELECT gsnap_snapshot()")
        assert digest(conn, asof("lt_log", s)) == digest(conn, "lt_log")
