"""The three capture orderings of docs/design.md ("Three orderings"), one focused test each (two
for the second), built so that a violation makes them fail:

1. the MVCC snapshot is taken before the dirty sets are switched: a write committed between
   the two (widened with gsnap.debug_declare_pause_ms) is not in that snapshot, and is in the
   next one although its page is never written again;
2. a write is recorded after heap changed the page, inside the writing transaction: a
   transaction that wrote before a snapshot and commits after it is not in that snapshot and
   is in the next with no further write (its pages are carried as unsettled); the same for a
   transaction that began after the declaration and wrote before the switch;
3. a snapshot's MVCC snapshot stays registered until its last page is read, and no longer:
   rows deleted and VACUUMed in blocks the capture has not read yet
   (gsnap.debug_capture_pause_ms) are still in the snapshot; once every page is read and
   before the snapshot is durable (gsnap.debug_commit_pause_ms) the worker holds no horizon
   and VACUUM removes them, and the snapshot still has them.
"""

import re
import threading
import time
from collections import Counter

import pytest

from cluster import gsnap_cluster
from workload import (contents, describe_diff, located_contents, progress, set_settings,
                      snapshots, wait_until)

DECLARE_PAUSE_MS = 2000


@pytest.fixture(scope="module")
def ocluster():
    yield from gsnap_cluster("orderings", ["autovacuum = off"])


class Background:
    """Runs one query on its own connection in a thread; `result()` joins it."""

    def __init__(self, cluster, query: str):
        self.value = None
        self.error = None
        self.conn = cluster.connect()

        def run():
            try:
                self.value = self.conn.execute(query).fetchone()
            except BaseException as e:  # re-raised by result()
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, timeout: float = 60):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the background query did not finish within {timeout} s"
        self.conn.close()
        if self.error:
            raise self.error
        return self.value


def read_exported(cluster, snap: int, exported: str, tables: list[str], xmax: list | None = None) -> dict:
    """The ground truth of an exported snapshot (and its xmax, appended to `xmax`), then
    releases it."""
    with cluster.connect() as r:
        r.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        r.execute(f"SET TRANSACTION SNAPSHOT '{exported}'")
        r.execute("SELECT gsnap_debug_release(%s)", (snap,))
        truth = {t: located_contents(r, t) for t in tables}
        if xmax is not None:
            xmax.append(r.execute("SELECT txid_snapshot_xmax(txid_current_snapshot())").fetchone()[0])
        r.execute("COMMIT")
    return truth


def in_pause_window(conn, pause_ms: int = DECLARE_PAUSE_MS):
    """Waits until the worker is declaring, then until it is surely past its MVCC snapshot
    (it takes it within milliseconds of starting; the pause that follows lasts pause_ms)."""
    wait_until(lambda: progress(conn)["phase"] == "declaring", 20, "the worker to be declaring",
               interval=0.01)
    # Nothing outside the worker shows the moment its MVCC snapshot is taken, so this is the
    # one fixed wait: a small part of the pause, and the tests check their timing premises
    # afterwards (the ground truth lacks the writes, the next span does not have them).
    time.sleep(min(0.4, pause_ms / 5000))


def written_blocks(conn, table: str) -> set[int]:
    return {r[0] for r in conn.execute("SELECT gsnap_written_blocks(%s)", (table,))}


def block_of(conn, table: str, where: str) -> set[int]:
    return {r[0] for r in conn.execute(
        f"SELECT DISTINCT (ctid::text::point)[0]::int FROM {table} WHERE {where}")}


def assert_equal(expected, got, what, where=None):
    if got != expected:
        pytest.fail(f"{what}:\n" + describe_diff(expected, got, where))


# --------------------------------------------------------------------------------------------
# Ordering 1: MVCC snapshot before the dirty-set switch
# --------------------------------------------------------------------------------------------

def test_write_committed_between_mvcc_snapshot_and_switch_is_in_the_next_snapshot(ocluster):
    c = ocluster
    with c.connect() as conn:
        conn.execute("CREATE TABLE ord1 (id int PRIMARY KEY, v text) USING gsnap")
        conn.execute("INSERT INTO ord1 SELECT i, repeat('a', 200) FROM generate_series(1, 300) i")
        conn.execute("SELECT gsnap_snapshot()")
        set_settings(conn, debug_declare_pause_ms=f"{DECLARE_PAUSE_MS}ms")
        try:
            decl = Background(c, "SELECT snap_id, exported FROM gsnap_debug_snapshot()")
            in_pause_window(conn)
            # Committed after the MVCC snapshot, before the switch: an update in place (HOT)
            # on one page, a non-HOT update and a delete on others.
            conn.execute("UPDATE ord1 SET v = 'during the pause' WHERE id = 3")
            conn.execute("UPDATE ord1 SET id = id + 1000 WHERE id = 150")
            conn.execute("DELETE FROM ord1 WHERE id = 290")
            snap, exported = decl.result()
        finally:
            set_settings(conn, debug_declare_pause_ms=None)
        truth = read_exported(c, snap, exported, ["ord1"])["ord1"]
        # Premises: the writes are after the MVCC snapshot (the ground truth does not have
        # them) and before the switch (they are not in the span that followed it).
        assert (3, conn.execute("SELECT md5(t::text) FROM ord1 t WHERE id = 3").fetchone()[0]) \
            not in truth[0], "the update committed before the MVCC snapshot: timing premise failed"
        assert written_blocks(conn, "ord1") == set(), (
            "the writes were recorded after the dirty-set switch: timing premise failed")

        assert_equal(truth[0], contents(conn, "ord1", snap), f"snapshot {snap} vs its MVCC snapshot",
                     truth[1])
        carried = snapshots(conn)[snap]["carried_pages"]
        assert carried >= 3, f"snapshot {snap} carried {carried} unsettled pages, expected >= 3"

        # No further write to ord1: the next snapshot must still see the three writes.
        assert written_blocks(conn, "ord1") == set()
        nxt = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        live, where = located_contents(conn, "ord1")
        assert_equal(live, contents(conn, "ord1", nxt), f"snapshot {nxt} vs the live table", where)


def test_insert_extending_the_table_between_mvcc_snapshot_and_switch_is_in_the_next_snapshot(ocluster):
    """As above, for an insert into a block the table did not have when the snapshot
    recorded its size (the relation is extended during the declaration pause)."""
    c = ocluster
    with c.connect() as conn:
        # fillfactor 10 and 600-byte rows: every insert goes to a new block.
        conn.execute("CREATE TABLE ord1x (id int PRIMARY KEY, v text) USING gsnap WITH (fillfactor = 10)")
        conn.execute("INSERT INTO ord1x SELECT i, repeat('b', 600) FROM generate_series(1, 20) i")
        conn.execute("SELECT gsnap_snapshot()")
        blocks_before = conn.execute("SELECT pg_relation_size('ord1x') / 8192").fetchone()[0]
        set_settings(conn, debug_declare_pause_ms=f"{DECLARE_PAUSE_MS}ms")
        try:
            decl = Background(c, "SELECT snap_id, exported FROM gsnap_debug_snapshot()")
            in_pause_window(conn)
            conn.execute("INSERT INTO ord1x VALUES (1000, repeat('c', 600))")
            snap, exported = decl.result()
        finally:
            set_settings(conn, debug_declare_pause_ms=None)
        truth = read_exported(c, snap, exported, ["ord1x"])["ord1x"]
        new_block = block_of(conn, "ord1x", "id = 1000")
        assert new_block == {blocks_before}, f"premise: the insert extended the table ({new_block})"
        assert all(i != 1000 for i, _ in truth[0]), "premise: the insert is after the MVCC snapshot"
        assert written_blocks(conn, "ord1x") == set(), "premise: the insert is before the switch"

        assert_equal(truth[0], contents(conn, "ord1x", snap), f"snapshot {snap} vs its MVCC snapshot")

        nxt = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        live, where = located_contents(conn, "ord1x")
        assert_equal(live, contents(conn, "ord1x", nxt),
                     f"snapshot {nxt} (taken after the insert committed, no write since) vs the live "
                     f"table; the insert went to block {blocks_before}, beyond the size recorded at "
                     f"snapshot {snap}", where)


# --------------------------------------------------------------------------------------------
# Ordering 2: writes recorded after the change, inside the transaction; unsettled pages
# --------------------------------------------------------------------------------------------

def test_transactions_spanning_snapshots_are_carried_until_they_finish(ocluster):
    c = ocluster
    with c.connect() as conn, c.connect() as a, c.connect() as b, c.connect() as lng:
        conn.execute("CREATE TABLE ord2 (id int PRIMARY KEY, v int NOT NULL, pad text) USING gsnap")
        conn.execute("INSERT INTO ord2 SELECT i, 0, repeat('p', 150) FROM generate_series(1, 400) i")
        s0 = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        before, _ = located_contents(conn, "ord2")

        # a: writes before s1, commits after s1 is durable (insert, HOT update, delete,
        #    non-HOT update, each on its page);
        # b: writes before s1, rolls back after it;
        # lng: writes before s1, stays open across s2, commits before s3.
        a.execute("BEGIN")
        a.execute("INSERT INTO ord2 VALUES (1001, 1, 'a')")
        a.execute("UPDATE ord2 SET v = v + 1 WHERE id = 10")
        a.execute("DELETE FROM ord2 WHERE id = 200")
        a.execute("UPDATE ord2 SET id = 2000 WHERE id = 300")
        b.execute("BEGIN")
        b.execute("UPDATE ord2 SET v = -1 WHERE id BETWEEN 100 AND 120")
        b.execute("INSERT INTO ord2 VALUES (1002, 2, 'b')")
        lng.execute("BEGIN")
        lng.execute("UPDATE ord2 SET v = 7 WHERE id = 50")
        lng.execute("DELETE FROM ord2 WHERE id = 390")
        pages = block_of(conn, "ord2", "id IN (10, 200, 300, 100, 50, 390)")

        snap1, exported = conn.execute("SELECT snap_id, exported FROM gsnap_debug_snapshot()").fetchone()
        truth1 = read_exported(c, snap1, exported, ["ord2"])["ord2"]
        assert truth1[0] == before, "premise: the snapshot sees none of the open transactions"
        assert_equal(before, contents(conn, "ord2", snap1), f"snapshot {snap1} (transactions open)")
        carried = snapshots(conn)[snap1]["carried_pages"]
        assert carried >= len(pages), (
            f"snapshot {snap1} carried {carried} pages; the open transactions wrote {len(pages)} pages")

        a.execute("COMMIT")
        b.execute("ROLLBACK")
        # Finishing a transaction writes no page: nothing is recorded.
        assert written_blocks(conn, "ord2") == set(), "a commit or rollback recorded a write"
        snap2 = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        after_a = conn.execute("SELECT (SELECT count(*) FROM ord2 WHERE id IN (1001, 2000))").fetchone()[0]
        assert after_a == 2
        # lng is still open: s2 must have a's changes, not b's nor lng's.
        lng_visible, where = located_contents(conn, "ord2")  # this session does not see lng's changes
        assert_equal(lng_visible, contents(conn, "ord2", snap2),
                     f"snapshot {snap2}: a committed and b rolled back after {snap1} with no write since",
                     where)

        lng.execute("COMMIT")
        assert written_blocks(conn, "ord2") == set()
        snap3 = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        live, where = located_contents(conn, "ord2")
        assert_equal(live, contents(conn, "ord2", snap3),
                     f"snapshot {snap3}: a transaction open across {snap1} and {snap2} committed", where)
        # and the earlier snapshots did not change
        assert contents(conn, "ord2", s0) == before
        assert contents(conn, "ord2", snap1) == before
        assert contents(conn, "ord2", snap2) == lng_visible


def test_transaction_begun_after_the_declaration_writing_before_the_switch(ocluster):
    c = ocluster
    with c.connect() as conn, c.connect() as a:
        conn.execute("CREATE TABLE ord2b (id int PRIMARY KEY, v int NOT NULL, pad text) USING gsnap")
        conn.execute("INSERT INTO ord2b SELECT i, 0, repeat('q', 150) FROM generate_series(1, 400) i")
        conn.execute("SELECT gsnap_snapshot()")
        before, _ = located_contents(conn, "ord2b")
        set_settings(conn, debug_declare_pause_ms=f"{DECLARE_PAUSE_MS}ms")
        try:
            decl = Background(c, "SELECT snap_id, exported FROM gsnap_debug_snapshot()")
            in_pause_window(conn)
            a.execute("BEGIN")
            xid = a.execute("SELECT txid_current()").fetchone()[0]
            a.execute("UPDATE ord2b SET v = 5 WHERE id = 20")
            a.execute("UPDATE ord2b SET id = 5000 WHERE id = 250")
            a.execute("DELETE FROM ord2b WHERE id = 380")
            snap, exported = decl.result()
        finally:
            set_settings(conn, debug_declare_pause_ms=None)
        xmax = []
        truth = read_exported(c, snap, exported, ["ord2b"], xmax)["ord2b"]
        assert truth[0] == before
        assert xid >= xmax[0], f"premise: the transaction ({xid}) began after the MVCC snapshot (xmax {xmax[0]})"
        assert written_blocks(conn, "ord2b") == set(), "premise: the writes are before the switch"

        assert_equal(before, contents(conn, "ord2b", snap), f"snapshot {snap}")
        a.execute("COMMIT")
        assert written_blocks(conn, "ord2b") == set()
        nxt = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        live, where = located_contents(conn, "ord2b")
        assert_equal(live, contents(conn, "ord2b", nxt),
                     f"snapshot {nxt}: a transaction that began during the declaration of {snap} "
                     "and wrote before its switch committed after it", where)


# --------------------------------------------------------------------------------------------
# Ordering 3: the MVCC snapshot is held until the capture is durable
# --------------------------------------------------------------------------------------------

VACUUM_TUPLES = r'finished vacuuming "[^"]*\.{}":.*?tuples: (\d+) removed, (\d+) remain, (\d+) are dead but not yet removable'


def vacuum_verbose(conn, table: str) -> tuple[int, int, int]:
    notices = []

    def handler(d):
        notices.append(d.message_primary)

    conn.add_notice_handler(handler)
    try:
        conn.execute(f"VACUUM (VERBOSE) {table}")
    finally:
        conn.remove_notice_handler(handler)
    for n in notices:
        m = re.search(VACUUM_TUPLES.format(re.escape(table)), n, re.S)
        if m:
            return tuple(int(x) for x in m.groups())
    raise AssertionError(f"no tuple counts in VACUUM VERBOSE output: {notices}")


def dead_tuples(conn, table: str) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = %s::regclass",
                        (table,)).fetchone()[0]


def worker_xmin(conn):
    return conn.execute(
        "SELECT backend_xmin FROM pg_stat_activity WHERE backend_type = 'gsnap worker'").fetchone()


def vacuum_rows_the_capture_has_not_read(conn, table: str, nblocks: int, snap: int) -> int:
    """Deletes the rows of the table's last 15 blocks while the capture of `snap` has not read
    them yet, vacuums, and checks that VACUUM could remove none of them (the snapshot still
    sees them); returns how many were deleted."""
    deleted = conn.execute(
        f"DELETE FROM {table} WHERE (ctid::text::point)[0] >= %s", (nblocks - 15,)).rowcount
    assert deleted > 500
    conn.execute("SELECT pg_stat_force_next_flush()")  # the DELETE's counts, before VACUUM's
    conn.execute("SELECT 1")
    removed, _, not_yet = vacuum_verbose(conn, table)
    p = progress(conn)
    assert p["snap_id"] == snap and p["phase"] == "capturing" and p["pages_done"] < nblocks - 15, (
        f"premise: the capture must still be in flight before the deleted rows' pages ({p})")
    assert removed == 0 and not_yet == deleted, (
        f"VACUUM removed {removed} of {deleted} rows snapshot {snap} sees before its "
        f"last page was read ({not_yet} kept)")
    return deleted


def test_snapshot_holds_vacuum_back_until_its_last_page_is_read(ocluster):
    c = ocluster
    with c.connect() as conn:
        conn.execute("CREATE TABLE ord3 (id int PRIMARY KEY, pad text) USING gsnap")
        conn.execute("INSERT INTO ord3 SELECT i, repeat('v', 150) FROM generate_series(1, 4000) i")
        # and, in the last blocks, values TOASTed out of line: their chunks are vacuumed too
        conn.execute("""INSERT INTO ord3 SELECT i, (SELECT string_agg(md5(i::text || j::text), '')
                                                    FROM generate_series(1, 150) j)
                        FROM generate_series(4001, 4100) i""")
        assert conn.execute("SELECT pg_relation_size(reltoastrelid) FROM pg_class "
                            "WHERE oid = 'ord3'::regclass").fetchone()[0] > 0
        nblocks = conn.execute("SELECT pg_relation_size('ord3') / 8192").fetchone()[0]
        assert nblocks >= 60
        before, _ = located_contents(conn, "ord3")
        set_settings(conn, capture_batch_pages=1, debug_capture_pause_ms="100ms",
                     debug_commit_pause_ms="60s")
        try:
            # The table's first snapshot captures every block, in block order, one per 100 ms.
            t0 = time.monotonic()
            snap = conn.execute("SELECT gsnap_snapshot(false)").fetchone()[0]
            wait_until(lambda: (lambda p: p["phase"] == "capturing" and p["snap_id"] == snap
                                and p["pages_done"] > 0)(progress(conn)),
                       30, f"the capture of snapshot {snap} to start")
            assert worker_xmin(conn)[0] is not None, "the worker holds no xmin during a capture"
            # Delete the rows of the last 15 blocks (not captured yet, TOASTed values among
            # them) and vacuum.
            deleted = vacuum_rows_the_capture_has_not_read(conn, "ord3", nblocks, snap)
            assert conn.execute("SELECT count(*) FROM ord3 WHERE id > 4000").fetchone()[0] == 0
            assert dead_tuples(conn, "ord3") == deleted

            # Every page read, the commit held back: the worker lets go of the horizon, and
            # VACUUM removes the rows the snapshot still has, although it is not durable yet.
            wait_until(lambda: progress(conn)["phase"] == "committing", 60,
                       f"the capture of snapshot {snap} to read its last page")
            read_s = time.monotonic() - t0
            wait_until(lambda: worker_xmin(conn)[0] is None, 10,
                       f"the worker to release snapshot {snap} after its last page was read")
            removed, _, not_yet = vacuum_verbose(conn, "ord3")
            p = progress(conn)
            assert p["phase"] == "committing" and p["last_durable"] != snap, (
                f"premise: snapshot {snap} must not be durable yet ({p})")
            assert (removed, not_yet) == (deleted, 0), (
                f"after snapshot {snap} read its last page VACUUM removed {removed} of {deleted} "
                f"dead rows ({not_yet} still not removable)")
            assert dead_tuples(conn, "ord3") == 0
            held_ms = p["horizon_held_ms"]
            assert held_ms is not None and 100 * (nblocks - 1) <= held_ms <= read_s * 1000 + 1000, (
                f"horizon_held_ms {held_ms} for {nblocks} blocks read one per 100 ms in {read_s:.1f} s")
        finally:
            set_settings(conn, capture_batch_pages=None, debug_capture_pause_ms=None,
                         debug_commit_pause_ms=None)

        got = contents(conn, "ord3", snap)  # waits for the capture
        assert_equal(before, got, f"snapshot {snap}: rows deleted and vacuumed during its capture")
        wait_until(lambda: progress(conn)["phase"] == "idle" and worker_xmin(conn)[0] is None, 20,
                   f"the worker to go idle after snapshot {snap} was durable")
        # and the snapshot does not depend on them
        assert contents(conn, "ord3", snap) == before


def test_a_capture_beyond_its_memory_reads_the_rest_under_the_snapshot(ocluster):
    """gsnap.capture_memory holds the copies of a few pages only: the capture copies those,
    then stores the rest as it reads them, and keeps the snapshot until the last one; rows
    deleted and vacuumed in blocks not read yet stay in the snapshot, and gsnap_progress()
    says how many pages did not fit."""
    c = ocluster
    with c.connect() as conn:
        conn.execute("CREATE TABLE ord4 (id int PRIMARY KEY, pad text) USING gsnap")
        conn.execute("INSERT INTO ord4 SELECT i, repeat('w', 150) FROM generate_series(1, 4000) i")
        nblocks = conn.execute("SELECT pg_relation_size('ord4') / 8192").fetchone()[0]
        assert nblocks >= 60
        before, _ = located_contents(conn, "ord4")
        set_settings(conn, capture_memory="64kB", capture_batch_pages=1, debug_capture_pause_ms="100ms")
        try:
            snap = conn.execute("SELECT gsnap_snapshot(false)").fetchone()[0]
            wait_until(lambda: (lambda p: p["phase"] == "capturing" and p["snap_id"] == snap
                                and p["pages_beyond_memory"] > 0)(progress(conn)),
                       30, f"the capture of snapshot {snap} to run out of memory for its copies")
            vacuum_rows_the_capture_has_not_read(conn, "ord4", nblocks, snap)
            set_settings(conn, capture_batch_pages=None, debug_capture_pause_ms=None)
            got = contents(conn, "ord4", snap)  # waits for the capture
            assert_equal(before, got, f"snapshot {snap}: rows deleted and vacuumed during its capture")
            p = progress(conn)
            # 64 kB hold a few copies (whole pages of 8 kB, or views of ~7 kB): every other
            # page of the snapshot (ord4's, and those other tables changed) was stored as read
            kept = p["pages_total"] - p["pages_beyond_memory"]
            assert p["last_durable"] == snap and p["pages_total"] >= nblocks and 1 <= kept <= 12, p
        finally:
            set_settings(conn, capture_memory=None, capture_batch_pages=None, debug_capture_pause_ms=None)


def test_a_snapshot_whose_subtransactions_overflowed_is_decided_under_its_lock(ocluster):
    """A transaction with more subtransactions than a snapshot lists (64) is open at the
    declaration: the snapshot then lists none of them, so its pages cannot be decided on
    copies after the release (the list would call them finished, and the pages they wrote
    would not be carried). Every page is decided under its lock: the snapshot leaves the
    open changes out and carries their pages, and the next snapshot, with no write since,
    has them once the transaction commits."""
    c = ocluster
    with c.connect() as conn, c.connect() as lng:
        conn.execute("CREATE TABLE ord_subx (id int PRIMARY KEY, v int NOT NULL) USING gsnap")
        conn.execute("INSERT INTO ord_subx SELECT i, 0 FROM generate_series(1, 3000) i")
        conn.execute("SELECT gsnap_snapshot()")
        before = contents(conn, "ord_subx")
        lng.execute("BEGIN")
        for i in range(70):  # each in its own subtransaction, on pages across the table
            lng.execute(f"SAVEPOINT s{i}")
            lng.execute("UPDATE ord_subx SET v = %s WHERE id = %s", (i + 1, 1 + 40 * i))
        # A transaction that ends after theirs began puts them below the snapshot's xmax,
        # where only the list says they run.
        conn.execute("CREATE TABLE ord_subx_later (x int)")
        pages = block_of(conn, "ord_subx", "id % 40 = 1 AND id <= 2800")
        assert len(pages) >= 5, pages
        snap1 = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        assert_equal(before, contents(conn, "ord_subx", snap1), f"snapshot {snap1} (70 subtransactions open)")
        carried = snapshots(conn)[snap1]["carried_pages"]
        assert carried >= len(pages), (
            f"snapshot {snap1} carried {carried} pages; the open subtransactions wrote {len(pages)}")
        lng.execute("COMMIT")
        assert written_blocks(conn, "ord_subx") == set(), "a commit recorded a write"
        snap2 = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        live, where = located_contents(conn, "ord_subx")
        assert live != before
        assert_equal(live, contents(conn, "ord_subx", snap2),
                     f"snapshot {snap2}: 70 subtransactions open across {snap1} committed", where)


def test_an_overflowed_snapshot_that_listed_some_subtransactions(ocluster):
    """The snapshot lists the subtransactions of the sessions before the first whose cache
    overflowed, then stops: it is overflowed *with* a count, and the registered copy of it
    has that count and no array (PostgreSQL's CopySnapshot leaves the array out). The worker
    read the count's ids from the missing array: a segfault of the worker, which restarts
    every session (seen once in CI under the differential workload). Sessions with one
    subtransaction each are opened before and after the overflowed one, so that some come
    first in the process array whatever slots they get; the snapshot is exact and the
    server never restarts."""
    c = ocluster
    with c.connect() as conn:
        conn.execute("CREATE TABLE ord_subx2 (id int PRIMARY KEY, v int NOT NULL) USING gsnap")
        conn.execute("CREATE TABLE ord_subx2_side (x int)")
        conn.execute("INSERT INTO ord_subx2 SELECT i, 0 FROM generate_series(1, 3000) i")
        conn.execute("SELECT gsnap_snapshot()")
        before = contents(conn, "ord_subx2")
        backend = conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0]

        def one_subtransaction(s, i):
            s.execute("BEGIN")
            s.execute("SAVEPOINT a")
            s.execute("INSERT INTO ord_subx2_side VALUES (%s)", (i,))

        sides = [c.connect() for _ in range(8)]
        lng = c.connect()
        sides += [c.connect() for _ in range(8)]
        try:
            for i, s in enumerate(sides[:8]):
                one_subtransaction(s, i)
            lng.execute("BEGIN")
            for i in range(70):
                lng.execute(f"SAVEPOINT s{i}")
                lng.execute("UPDATE ord_subx2 SET v = %s WHERE id = %s", (i + 1, 1 + 40 * i))
            for i, s in enumerate(sides[8:]):
                one_subtransaction(s, i + 8)
            # A transaction that ends after theirs began puts them below the snapshot's xmax
            # (only running transactions below it are listed).
            conn.execute("INSERT INTO ord_subx2_side VALUES (-1)")
            for _ in range(5):
                snap = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
                assert_equal(before, contents(conn, "ord_subx2", snap), f"snapshot {snap}")
            lng.execute("COMMIT")
            for s in sides:
                s.execute("COMMIT")
        finally:
            for s in sides + [lng]:
                s.close()
        assert conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0] == backend
        assert "terminated by signal" not in c.log()
        snap = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        live, where = located_contents(conn, "ord_subx2")
        assert_equal(live, contents(conn, "ord_subx2", snap), f"snapshot {snap}", where)


def paced_capture(conn, table: str, rows: int) -> tuple[int, Counter]:
    """Fills `table` (~280 blocks), sets a snapshot interval of an hour (phase two may take
    half of it) and declares a snapshot; returns it, once phase one has read every page and
    phase two stores them paced, and the table's rows."""
    conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, pad text) USING gsnap")
    conn.execute(f"INSERT INTO {table} SELECT i, repeat(md5(i::text), 5) FROM generate_series(1, {rows}) i")
    before, _ = located_contents(conn, table)
    conn.execute("SET statement_timeout = '90s'")  # a capture that never hurries fails the test
    set_settings(conn, snapshot_interval="1h", capture_pace="0.5")
    snap = conn.execute("SELECT gsnap_snapshot(false)").fetchone()[0]
    wait_until(lambda: (lambda p: p["snap_id"] == snap and p["phase"] in ("deciding", "committing")
                        and p["pages_to_store"] > 0)(progress(conn)),
               30, f"phase one of snapshot {snap} to read its last page")
    return snap, before


def test_phase_two_is_paced_over_the_interval_and_hurries_for_a_reader(ocluster):
    """With gsnap.snapshot_interval = 1h, phase two (storing what phase one read) is spread
    over half an hour: phase one reads every page and lets go of the horizon at once, then the
    decisions on the copies are spread over a quarter of that, at most 5 s (nothing is
    stored before they end), then the pages are stored a chunk at a time on the worker's thread while the worker
    answers other requests; a session reading the snapshot makes it hurry, and it reads as
    the table was."""
    with ocluster.connect() as conn:
        try:
            snap, before = paced_capture(conn, "ord6", 15000)
            assert worker_xmin(conn)[0] is None, "the worker holds a horizon during phase two"
            to_store = progress(conn)["pages_to_store"]
            time.sleep(1.5)
            p = progress(conn)
            assert p["last_durable"] != snap and p["pages_to_store"] >= to_store - 64, (
                f"phase two of snapshot {snap} was not paced: {to_store} pages to store, then {p}")
            # ~280 copies, decided 256 at a time over 5 s (a quarter of phase two's half hour,
            # at most 5 s): the second batch is due ~4.6 s in.
            assert p["phase"] == "deciding", (
                f"snapshot {snap} decided its ~280 copies within 1.5 s: not paced ({p})")
            t0 = time.monotonic()
            assert snapshots(conn)[snap]["state"] == "capturing"  # the worker answers
            assert time.monotonic() - t0 < 5
            got = contents(conn, "ord6", snap)  # waits for the capture, which hurries
            waited = time.monotonic() - t0
            assert_equal(before, got, f"snapshot {snap}, stored paced then in a hurry")
            assert waited < 60, f"a reader waited {waited:.0f} s for a paced capture"
            assert progress(conn)["pages_to_store"] == 0
        finally:
            set_settings(conn, snapshot_interval=None, capture_pace=None)


def test_a_paced_capture_hurries_when_the_next_snapshot_is_declared(ocluster):
    """A snapshot declared while the previous one's phase two is paced makes it hurry (a
    queued snapshot holds VACUUM back): both are durable within seconds, and right."""
    with ocluster.connect() as conn:
        try:
            first, before = paced_capture(conn, "ord7", 15000)
            conn.execute("UPDATE ord7 SET pad = md5(pad) WHERE id % 10 = 0")
            after, _ = located_contents(conn, "ord7")
            t0 = time.monotonic()
            second = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]  # until durable
            waited = time.monotonic() - t0
            assert waited < 60, f"the next snapshot waited {waited:.0f} s behind a paced capture"
            assert_equal(before, contents(conn, "ord7", first), f"snapshot {first}")
            assert_equal(after, contents(conn, "ord7", second), f"snapshot {second}")
        finally:
            set_settings(conn, snapshot_interval=None, capture_pace=None)


def test_a_restart_during_phase_two_fails_that_snapshot_and_the_next_one_is_whole(ocluster):
    """A clean restart while phase two is paced stops its thread (the server does not wait
    half an hour): the snapshot is failed with a reason, and the next snapshot, taking the
    failed one's pages too, reads as the table is."""
    c = ocluster
    with c.connect() as conn:
        try:
            snap, before = paced_capture(conn, "ord8", 15000)
        finally:
            set_settings(conn, snapshot_interval=None, capture_pace=None)
    t0 = time.monotonic()
    c.restart()
    assert time.monotonic() - t0 < 60
    with c.connect() as conn:
        wait_until(lambda: progress(conn)["worker"] == "ready", 60, "the worker to start")
        row = snapshots(conn)[snap]
        assert row["state"] == "failed", row
        nxt = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        assert_equal(before, contents(conn, "ord8", nxt), f"snapshot {nxt} after the restart")


def wait_for_copies_ahead(conn, what: str) -> None:
    """Waits until the worker holds copies made ahead of the next periodic snapshot."""
    wait_until(lambda: progress(conn)["copies_ahead"] > 0, 30, f"copies ahead of {what}")


def copies_made_ahead(conn) -> int:
    """Waits until the worker has made its copies ahead of the next periodic snapshot (their
    count steady for 0.3 s) and returns how many it holds."""
    wait_for_copies_ahead(conn, "the periodic snapshot")

    def settled():
        first = progress(conn)["copies_ahead"]
        time.sleep(0.3)
        return first if first == progress(conn)["copies_ahead"] else None
    return wait_until(settled, 10, "the copies ahead to be made")


def test_copies_made_ahead_are_taken_only_for_pages_unchanged_since(ocluster):
    """With gsnap.snapshot_interval set, the worker copies the span's written pages shortly
    before the next periodic snapshot (gsnap.capture_copy_ahead), holding no snapshot; the
    next capture takes a copy only for a page whose LSN is unchanged. Pages updated after
    the copies were made must be read again: the snapshot (declared on request right after
    the updates, so it takes the copies) reads as the table is, and it took copies for the
    pages nobody wrote since, not for the others."""
    with ocluster.connect() as conn:
        try:
            conn.execute("CREATE TABLE ord10 (id int PRIMARY KEY, v int, pad text) USING gsnap")
            conn.execute("INSERT INTO ord10 SELECT i, 0, repeat('x', 200) FROM generate_series(1, 3000) i")
            conn.execute("SELECT gsnap_snapshot()")
            conn.execute("UPDATE ord10 SET v = 1")  # every page in the span
            blocks = conn.execute("SELECT count(DISTINCT (ctid::text::point)[0]) FROM ord10").fetchone()[0]
            # 8 s between periodic snapshots, copies made 2 s before each: the updates and
            # the declaration below fit between the copies and the periodic snapshot.
            set_settings(conn, snapshot_interval="8s", capture_copy_ahead="2s")
            wait_for_copies_ahead(conn, "the periodic snapshot")
            held = progress(conn)["copies_ahead"]
            conn.execute("UPDATE ord10 SET v = 2 WHERE id % 300 = 0")  # ~10 pages change
            changed = block_of(conn, "ord10", "id % 300 = 0")
            expected, where = located_contents(conn, "ord10")
            snap = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
            p = progress(conn)
            assert_equal(expected, contents(conn, "ord10", snap), f"snapshot {snap}", where)
            assert p["snap_id"] == snap, p
            # The updated pages' new versions are where there was room: on their pages or
            # elsewhere; either way each page they touched is read again.
            assert 0 < p["pages_copied_ahead"] <= held, p
            assert p["pages_copied_ahead"] <= p["pages_total"] - len(changed), (
                f"snapshot {snap} took copies of pages written after them: {p}, "
                f"{len(changed)} pages changed of {blocks}")
        finally:
            set_settings(conn, snapshot_interval=None, capture_copy_ahead=None)


def test_a_copy_made_ahead_is_taken_for_a_page_nobody_wrote_since_even_if_vacuum_did(ocluster):
    """Copying ahead splits the span: a page not recorded in its second part was written by
    nobody since its copy, so the capture takes the copy without looking at the page, even
    after VACUUM pruned and froze it (which changes its LSN but no snapshot's view of it).
    Pages written after the split are still looked at. While the span is split,
    gsnap_written_blocks() lists both parts; the snapshot reads as the table is."""
    with ocluster.connect() as conn:
        try:
            conn.execute("CREATE TABLE ord12 (id int PRIMARY KEY, v int, pad text) USING gsnap")
            conn.execute("INSERT INTO ord12 SELECT i, 0, repeat('x', 200) FROM generate_series(1, 3000) i")
            conn.execute("SELECT gsnap_snapshot()")
            conn.execute("UPDATE ord12 SET v = 1")  # every page written, dead versions on each
            first_part = written_blocks(conn, "ord12")
            # Copies made 3 s before the periodic snapshot: the writes, the VACUUM and the
            # declaration below fit between the copies and that snapshot.
            set_settings(conn, snapshot_interval="12s", capture_copy_ahead="3s")
            held = copies_made_ahead(conn)
            conn.execute("UPDATE ord12 SET v = 2 WHERE id % 300 = 0")  # ~10 rows after the split
            changed = block_of(conn, "ord12", "id % 300 = 0")
            listed = written_blocks(conn, "ord12")
            assert first_part | changed <= listed, (
                f"the split span lists {sorted(listed)}, not both of its parts "
                f"({sorted(first_part)} and {sorted(changed)})")
            # Prunes the dead versions and freezes the rest: every copied page changes, and
            # no write is recorded.
            conn.execute("VACUUM (FREEZE) ord12")
            expected, where = located_contents(conn, "ord12")
            snap = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
            p = progress(conn)
            assert_equal(expected, contents(conn, "ord12", snap), f"snapshot {snap}", where)
            assert p["snap_id"] == snap, p
            # Every page changed since its copy (VACUUM), so a capture that looked at each
            # one would take none; most were not written since the split.
            assert held // 2 <= p["pages_copied_ahead"] <= held, (
                f"snapshot {snap} took {p['pages_copied_ahead']} of {held} copies made ahead")
        finally:
            set_settings(conn, snapshot_interval=None, capture_copy_ahead=None)


def test_pages_of_unlogged_tables_are_not_copied_ahead(ocluster):
    """An unlogged table's page LSNs do not change when its rows do, so a copy of one could
    not be checked: the worker copies ahead only the pages of WAL-logged tables. With both
    written in the span, the copies held never exceed the logged table's pages (the unlogged
    one is several times larger), and the snapshot reads both tables as they are."""
    with ocluster.connect() as conn:
        try:
            conn.execute("CREATE TABLE ord11_logged (id int PRIMARY KEY, v int, pad text) USING gsnap")
            conn.execute("CREATE UNLOGGED TABLE ord11_unlogged (id int PRIMARY KEY, v int, pad text) USING gsnap")
            conn.execute("INSERT INTO ord11_logged SELECT i, 0, repeat('x', 200) FROM generate_series(1, 600) i")
            conn.execute("INSERT INTO ord11_unlogged SELECT i, 0, repeat('y', 200) FROM generate_series(1, 6000) i")
            conn.execute("SELECT gsnap_snapshot()")
            conn.execute("UPDATE ord11_logged SET v = 1")
            conn.execute("UPDATE ord11_unlogged SET v = 1")
            pages = {t: conn.execute(f"SELECT pg_relation_size('{t}') / 8192").fetchone()[0]
                     for t in ("ord11_logged", "ord11_unlogged")}
            assert pages["ord11_unlogged"] > 3 * pages["ord11_logged"], pages
            set_settings(conn, snapshot_interval="8s", capture_copy_ahead="2s")
            held = copies_made_ahead(conn)
            assert 0 < held <= pages["ord11_logged"], (
                f"{held} copies held for {pages['ord11_logged']} pages of the logged table: "
                f"pages of the unlogged one ({pages['ord11_unlogged']}) were copied ahead")
            snap = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
            p = progress(conn)
            assert p["snap_id"] == snap and p["pages_copied_ahead"] <= pages["ord11_logged"], p
            for t in ("ord11_logged", "ord11_unlogged"):
                expected, where = located_contents(conn, t)
                assert_equal(expected, contents(conn, t, snap), f"snapshot {snap} of {t}", where)
        finally:
            set_settings(conn, snapshot_interval=None, capture_copy_ahead=None)


def test_copies_made_ahead_under_concurrent_writes_match_the_ground_truth(ocluster):
    """Writers keep going while the worker copies ahead and while snapshots taking the
    copies are declared (each with its exported MVCC snapshot as the ground truth): every
    snapshot equals what its MVCC snapshot saw, and copies were taken."""
    from workload import TABLES, GroundTruth, Workload, create_tables
    with ocluster.connect() as conn:
        create_tables(conn)
        conn.execute("SELECT gsnap_snapshot()")
    truth = GroundTruth(ocluster, TABLES)
    taken = 0
    try:
        with ocluster.connect() as conn:
            with Workload(ocluster, n=3, seed=710, epoch=71, vacuum_probability=0.05) as load:
                set_settings(conn, snapshot_interval="4s", capture_copy_ahead="1s")
                for i in range(4):
                    wait_for_copies_ahead(conn, f"periodic snapshot {i + 1}")
                    time.sleep(0.1 * i)  # the writers change some of the copied pages
                    snap = truth.take()
                    # What its phase one took, read before the periodic snapshot's capture
                    # replaces it in gsnap_progress().
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:
                        p = progress(conn)
                        if p["snap_id"] != snap or p["phase"] not in ("capturing", "declaring"):
                            break
                        time.sleep(0.005)
                    if p["snap_id"] == snap:
                        taken += p["pages_copied_ahead"]
                load.finish()
            set_settings(conn, snapshot_interval=None, capture_copy_ahead=None)
            problems = truth.check(conn)
            assert not problems, "snapshots taking copies made ahead differ from their MVCC snapshot:\n" + \
                "\n".join(problems[:10])
            assert taken > 0, "no snapshot took a copy made ahead"
    finally:
        truth.close()
        with ocluster.connect() as conn:
            set_settings(conn, snapshot_interval=None, capture_copy_ahead=None)


def test_progress_shows_a_capture_in_flight_as_capturing(ocluster):
    """gsnap_progress() while a capture is held in flight and another snapshot is declared
    (queued behind it): the worker is capturing, whatever it declared in between."""
    c = ocluster
    with c.connect() as conn:
        conn.execute("CREATE TABLE prog (id int PRIMARY KEY, pad text) USING gsnap")
        conn.execute("INSERT INTO prog SELECT i, repeat('w', 150) FROM generate_series(1, 2000) i")
        set_settings(conn, capture_batch_pages=1, debug_capture_pause_ms="200ms")
        try:
            first = conn.execute("SELECT gsnap_snapshot(false)").fetchone()[0]
            wait_until(lambda: (lambda p: p["phase"] == "capturing" and p["snap_id"] == first
                                and p["pages_done"] > 0)(progress(conn)),
                       30, f"the capture of snapshot {first} to start")
            second = conn.execute("SELECT gsnap_snapshot(false)").fetchone()[0]
            mark = progress(conn)["pages_done"]
            # a batch of the first capture after the declaration (or its end: the premise
            # below says so)
            p = wait_until(lambda: (lambda p: (p["snap_id"] != first or p["pages_done"] > mark) and p)(
                progress(conn)), 20, f"the capture of snapshot {first} to go on after declaring {second}")
            in_flight = snapshots(conn)[first]["state"] == "capturing"
            assert in_flight and p["snap_id"] == first and p["pages_done"] < p["pages_total"], (
                f"premise: the capture of {first} is still in flight ({p})")
            assert p["queued"] == 1, f"snapshot {second} should be queued behind {first}: {p}"
            assert p["phase"] == "capturing", (
                f"gsnap_progress() reports phase '{p['phase']}' while the capture of snapshot "
                f"{first} is in flight ({p['pages_done']} of {p['pages_total']} pages) and "
                f"snapshot {second} waits behind it")
        finally:
            set_settings(conn, capture_batch_pages=None, debug_capture_pause_ms=None)
        conn.execute("SELECT count(*) FROM gsnap_asof(NULL::prog, %s)", (second,))


def test_progress_shows_how_far_the_last_capture_dipped_the_writes():
    """gsnap_progress().worst_second: the lowest rate of write transactions in any second of
    the last capture, over the median rate of the minute before it. Unknown (NULL) when the
    database hardly wrote before the capture; about 1 under steady writes the capture does not
    disturb; near 0 when the writes stopped while the capture ran."""
    gen = gsnap_cluster("worst-second")
    c = next(gen)
    try:
        with c.connect() as conn:
            conn.execute("CREATE TABLE ws (id int PRIMARY KEY, v int) USING gsnap")
            conn.execute("CREATE TABLE ws_log (t timestamptz)")
            conn.execute("INSERT INTO ws SELECT g, 0 FROM generate_series(1, 1000) g")
            # idle: no ratio
            time.sleep(7)
            conn.execute("SELECT gsnap_snapshot()")
            time.sleep(2.5)
            assert progress(conn)["worst_second"] is None

            writing, stop = threading.Event(), threading.Event()
            writing.set()

            def writer():
                with c.connect() as w:
                    while not stop.is_set():
                        if writing.is_set():
                            w.execute("INSERT INTO ws_log VALUES (now())")
                        time.sleep(0.005)

            t = threading.Thread(target=writer)
            t.start()
            try:
                time.sleep(9)
                # steady writes, an ordinary capture: no real dip
                conn.execute("UPDATE ws SET v = v + 1 WHERE id % 10 = 0")
                conn.execute("SELECT gsnap_snapshot()")
                steady = wait_until(lambda: progress(conn)["worst_second"], 10,
                                    "a worst second for the capture under steady writes")
                assert 0.3 < steady < 3, f"worst second {steady} under steady writes"
                # the writes stop for 3 s while a capture (held open 4 s before its commit) runs
                set_settings(conn, debug_commit_pause_ms="4s")
                try:
                    snap = conn.execute("SELECT gsnap_snapshot(false)").fetchone()[0]
                    writing.clear()
                    time.sleep(3)
                    writing.set()
                    wait_until(lambda: progress(conn)["last_durable"] == snap, 30,
                               f"snapshot {snap} to be durable")
                finally:
                    set_settings(conn, debug_commit_pause_ms=None)
                dipped = wait_until(lambda: (lambda w: w is not None and w != steady and w)(
                    progress(conn)["worst_second"]), 10, "the worst second of the stalled capture")
                assert dipped < 0.2, f"worst second {dipped} while the writes stopped for 3 s"
            finally:
                stop.set()
                t.join()
    finally:
        gen.close()
