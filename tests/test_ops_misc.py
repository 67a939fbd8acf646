"""Dirty-set overflow, databases other than gsnap.database, and pg_dump/pg_restore of a
database whose gsnap tables have snapshots."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

from cluster import Cluster, gsnap_cluster, in_threads
from ops_helpers import (
    asof,
    configure,
    digest,
    drop_database,
    make_table,
    measure,
    progress,
    snapshots,
    val,
    wait_ready,
    wait_settled,
    wait_until,
)


@pytest.fixture(scope="module")
def ovf():
    """A cluster with the smallest dirty sets gsnap allows (1024 pages)."""
    yield from gsnap_cluster("ovf", ["gsnap.max_dirty_pages = 1024"])


def test_dirty_set_overflow_warns_and_snapshots_stay_exact(ovf):
    """More distinct pages written in one span than gsnap.max_dirty_pages: a WARNING in the
    log, the table is captured completely, and the snapshot equals what its MVCC snapshot saw
    (exported by gsnap_debug_snapshot()), also with writes racing after the declaration; the
    spans after it are exact too."""
    with ovf.connect() as conn, ovf.connect() as truth:
        make_table(conn, "ovf_t", 25000)  # ~715 pages; an UPDATE of every row writes ~1400
        make_table(conn, "ovf_small", 300)
        snap = None
        try:
            s0 = val(conn, "SELECT gsnap_snapshot()")
            d0 = digest(conn, "ovf_t")
            log_from = len(ovf.log())
            conn.execute("UPDATE ovf_t SET v = v + 1")
            conn.execute("UPDATE ovf_small SET v = v + 1 WHERE id % 10 = 0")
            assert val(conn, "SELECT gsnap_full_capture_pending('ovf_t')")
            snap, exported = conn.execute("SELECT * FROM gsnap_debug_snapshot()").fetchone()
            # writes the snapshot must not see
            conn.execute("UPDATE ovf_t SET v = 0 WHERE id % 3 = 0")
            conn.execute("DELETE FROM ovf_t WHERE id % 7 = 0")
            conn.execute("INSERT INTO ovf_small VALUES (-1, -1, 'after')")
            truth.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            truth.execute(f"SET TRANSACTION SNAPSHOT '{exported}'")
            expected = {t: digest(truth, t) for t in ("ovf_t", "ovf_small")}
            truth.execute("COMMIT")
            states = wait_settled(conn, 60)
            assert states[snap] == "committed", states
            for t, d in expected.items():
                assert digest(conn, asof(t, snap)) == d, f"{t} AS OF {snap} (after a dirty-set overflow)"
            assert digest(conn, asof("ovf_t", s0)) == d0
            log = ovf.log()[log_from:]
            assert "WARNING" in log and "did not fit the dirty set" in log, log[-2000:]
            print("[ops] overflow: " + next(l for l in log.splitlines() if "did not fit" in l))

            s2 = val(conn, "SELECT gsnap_snapshot()")  # this span overflowed too
            for t in ("ovf_t", "ovf_small"):
                assert digest(conn, asof(t, s2)) == digest(conn, t), f"{t} AS OF {s2}"
            conn.execute("UPDATE ovf_t SET v = v + 5 WHERE id % 101 = 0")  # a small span
            assert not val(conn, "SELECT gsnap_full_capture_pending('ovf_t')")
            s3 = val(conn, "SELECT gsnap_snapshot()")
            assert digest(conn, asof("ovf_t", s3)) == digest(conn, "ovf_t")
            assert digest(conn, asof("ovf_t", snap)) == expected["ovf_t"]
        finally:
            if snap is not None:
                conn.execute("SELECT gsnap_debug_release(%s)", (snap,))
            conn.execute("DROP TABLE IF EXISTS ovf_t, ovf_small")


def test_dirty_set_overflow_warning_counts_tables(ovf):
    """The overflow WARNING says how many tables overflowed into a full capture: one table
    rewritten completely (every page written many times) is one table, not a count of
    writes."""
    with ovf.connect() as conn:
        make_table(conn, "ovf_count", 25000)
        try:
            val(conn, "SELECT gsnap_snapshot()")
            log_from = len(ovf.log())
            conn.execute("UPDATE ovf_count SET v = v + 1")
            conn.execute("UPDATE ovf_count SET v = v + 1")
            val(conn, "SELECT gsnap_snapshot()")
            line = wait_until(lambda: next((l for l in ovf.log()[log_from:].splitlines()
                                            if "did not fit the dirty set" in l), None),
                              5, "the overflow WARNING")
            print(f"[ops] overflow: {line}")
            assert "written pages of 1 table(s) did not fit the dirty set" in line, line
        finally:
            conn.execute("DROP TABLE IF EXISTS ovf_count")


def test_other_databases_are_refused(ovf):
    """gsnap serves gsnap.database only: CREATE EXTENSION elsewhere fails with 0A000 naming it;
    in a clone of the gsnap database (CREATE DATABASE ... TEMPLATE postgres, which copies the
    access method and the gsnap tables) creating a gsnap table, reading AS OF and declaring
    snapshots fail with 0A000 naming gsnap.database."""
    with ovf.connect() as conn:
        make_table(conn, "db_t", 200)
        snap = val(conn, "SELECT gsnap_snapshot()")
        conn.execute("DROP DATABASE IF EXISTS ops_other")
        conn.execute("DROP DATABASE IF EXISTS ops_clone")
        conn.execute("CREATE DATABASE ops_other")
    try:
        with ovf.connect("ops_other") as o:
            with pytest.raises(psycopg.Error) as err:
                o.execute("CREATE EXTENSION gsnap")
            print(f"[ops] CREATE EXTENSION in another database: {err.value.sqlstate} {err.value}")
            assert err.value.sqlstate == "0A000"
            assert '"postgres"' in str(err.value)
            assert "gsnap.database" in (err.value.diag.message_hint or "")
            assert val(o, "SELECT count(*) FROM pg_am WHERE amname = 'gsnap'") == 0

        # Clone the gsnap database: its template must have no other session, so stop the
        # worker (it comes back 5 s later) and copy in that window.
        with ovf.connect("template1") as admin:
            deadline = time.monotonic() + 20
            while True:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                              " WHERE datname = 'postgres' AND pid <> pg_backend_pid()")
                try:
                    admin.execute("CREATE DATABASE ops_clone TEMPLATE postgres")
                    break
                except psycopg.errors.ObjectInUse:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        with ovf.connect("ops_clone") as g:
            assert val(g, "SELECT count(*) FROM db_t") == 200
            for sql in ("CREATE TABLE clone_t (a int) USING gsnap",
                        f"SELECT count(*) FROM gsnap_asof(NULL::db_t, {snap})",
                        "SELECT count(*) FROM gsnap_asof(NULL::db_t, now())",
                        "SELECT gsnap_snapshot()",
                        "SELECT count(*) FROM gsnap_snapshots()"):
                with pytest.raises(psycopg.Error) as err:
                    g.execute(sql)
                print(f"[ops] in a clone, {sql}: {err.value.sqlstate} {err.value}")
                assert err.value.sqlstate == "0A000", (sql, err.value)
                assert '"postgres"' in str(err.value), (sql, err.value)
        with ovf.connect() as conn:
            wait_ready(conn, 20)
            s2 = val(conn, "SELECT gsnap_snapshot()")
            assert digest(conn, asof("db_t", s2)) == digest(conn, "db_t")
    finally:
        # (test_drop_database_does_not_wait_for_the_worker in test_operations.py is about
        # DROP DATABASE itself; here it is only cleanup, bounded)
        for db in ("ops_other", "ops_clone"):
            try:
                drop_database(ovf, db, timeout_s=3)
            except psycopg.errors.QueryCanceled:
                pass
        with ovf.connect() as conn:
            wait_ready(conn, 20)
            conn.execute("DROP TABLE IF EXISTS db_t")


def test_dump_and_restore_of_a_database_with_snapshots(ovf, tmp_path):
    """pg_dump of the gsnap database after snapshots exist, restored into another cluster
    (whose gsnap.database is created only then): tables, access methods, indexes and data come
    back (snapshots do not: they live in the store); the source's snapshots are untouched and
    the restored tables snapshot correctly."""
    tmp_path.chmod(0o755)
    target = Cluster("restore", conf=["gsnap.database = 'restored'"])
    try:
        with ovf.connect() as conn:
            conn.execute("DROP TABLE IF EXISTS dr_h, dr_g")
            conn.execute("CREATE TABLE dr_g (id int PRIMARY KEY, big text, j jsonb) USING gsnap")
            conn.execute("CREATE TABLE dr_h (id int PRIMARY KEY, g int REFERENCES dr_g) USING heap")
            conn.execute("CREATE INDEX ON dr_g USING gin (j)")
            conn.execute("INSERT INTO dr_g SELECT i, repeat(md5(i::text), 300), jsonb_build_object('i', i)"
                         " FROM generate_series(1, 400) i")
            conn.execute("INSERT INTO dr_h SELECT i, i FROM generate_series(1, 400) i")
            s1 = val(conn, "SELECT gsnap_snapshot()")
            d1 = digest(conn, "dr_g")
            conn.execute("UPDATE dr_g SET big = big || 'x' WHERE id % 4 = 0")
            s2 = val(conn, "SELECT gsnap_snapshot()")
            d2 = digest(conn, "dr_g")
            live_h = digest(conn, "dr_h")
        dump = tmp_path / "gsnap.dump"
        r = ovf.run("pg_dump", "-Fc", "-d", "postgres", "-f", str(dump))
        assert r.returncode == 0, r.stderr

        target.start()
        with target.connect() as conn:
            # the worker cannot start until gsnap.database exists
            conn.execute("CREATE DATABASE restored")
            t0 = time.monotonic()
            wait_until(lambda: val(conn, "SELECT count(*) FROM pg_stat_activity WHERE"
                                   " backend_type = 'gsnap worker' AND datname = 'restored'"), 20,
                       "the worker to start once gsnap.database exists")
        r = target.run("pg_restore", "-d", "restored", str(dump), check=False)
        assert r.returncode == 0, r.stderr
        print(f"[ops] dump/restore: worker ready {time.monotonic() - t0:.1f} s after CREATE DATABASE")
        with target.connect("restored") as t:
            am = dict(t.execute("SELECT c.relname, a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam"
                                " WHERE c.relname IN ('dr_g', 'dr_h')").fetchall())
            assert am == {"dr_g": "gsnap", "dr_h": "heap"}, am
            assert digest(t, "dr_g") == d2
            assert digest(t, "dr_h") == live_h
            assert val(t, "SELECT count(*) FROM dr_g WHERE j @> '{\"i\": 7}'") == 1
            assert snapshots(t) == [], "snapshots do not travel with a dump"
            snap = val(t, "SELECT gsnap_snapshot()")
            assert digest(t, asof("dr_g", snap)) == d2
        with ovf.connect() as conn:
            assert digest(conn, asof("dr_g", s1)) == d1
            assert digest(conn, asof("dr_g", s2)) == d2
    finally:
        target.destroy()
        with ovf.connect() as conn:
            conn.execute("DROP TABLE IF EXISTS dr_h, dr_g")


@pytest.fixture(scope="module")
def tiny_cache():
    """A cluster whose image cache holds 256 images, its minimum (scans go through batches of 32,
    each prefetched while the previous one is read, and evict each other's images)."""
    for c in gsnap_cluster("tinycache", ["gsnap.image_cache_size = 2MB"]):
        with c.connect() as conn:
            assert val(conn, "SELECT image_cache_slots FROM gsnap_index_stats()") == 256
        yield c


@pytest.mark.parametrize("verify", ["off", "on"])
def test_reads_through_a_tiny_cache_with_and_without_image_verification(tiny_cache, verify):
    """AS OF, range and diff read every image from the store through a cache far smaller than
    the table, with prefetching and concurrent scans, and return exactly what the table held
    at each snapshot, whether images are checked against their fingerprints or not."""
    with tiny_cache.connect() as conn:
        configure(conn, verify_images=verify)
        make_table(conn, "tc", 40000)  # ~1150 pages
        truth, snaps = [], []
        for step in range(3):
            snaps.append(val(conn, "SELECT gsnap_snapshot()"))
            truth.append(digest(conn, "tc"))
            conn.execute(f"UPDATE tc SET v = v + 1 WHERE id % {7 + step} = 0")
            conn.execute(f"DELETE FROM tc WHERE id % 97 = {step}")
        loads = val(conn, "SELECT image_loads FROM gsnap_index_stats()")
        for s, t in zip(snaps, truth):
            assert digest(conn, asof("tc", s)) == t
        assert val(conn, "SELECT image_loads FROM gsnap_index_stats()") - loads >= 1000
        # every snapshot of the range, read once for all of them
        for s, t in zip(snaps, truth):
            got = digest(conn, f"(SELECT (rec).* FROM gsnap_range(NULL::tc, {snaps[0]}, "
                               f"{snaps[-1]}) WHERE snap_id = {s})")
            assert got == t
        # diff: the updates of the first step, one removed and one added row each
        counts = dict(conn.execute(
            f"SELECT change, count(*) FROM gsnap_diff(NULL::tc, {snaps[0]}, {snaps[1]}) "
            "GROUP BY 1").fetchall())
        removed = val(conn, "SELECT count(*) FROM generate_series(1, 40000) g "
                            "WHERE g % 7 = 0 OR g % 97 = 0")
        added = val(conn, "SELECT count(*) FROM generate_series(1, 40000) g "
                          "WHERE g % 7 = 0 AND g % 97 <> 0")
        assert counts == {"added": added, "removed": removed}
        # concurrent scans evicting each other's images
        results = {}

        def scan(i):
            with tiny_cache.connect() as c:
                results[i] = digest(c, asof("tc", snaps[i % 3]))

        failures = in_threads(scan, 4, 120)
        assert not failures, failures
        assert all(results[i] == truth[i % 3] for i in range(4))
        configure(conn, verify_images=None)


def test_a_scan_finds_each_batch_loaded_while_it_read_the_one_before(tiny_cache):
    """A serial AS OF scan asks the worker to load its next batch of images while it reads
    the current one, and then pins that batch from the cache without asking again: of a
    table of ~1150 pages read through batches of 32, only the first batch is missing when
    pinned. (A scan whose batches were all cached made no request that collected its last
    prefetch, so every other prefetch was skipped and half the batches were loaded while
    the scan waited.) Each row costs the scan more than its image costs the worker, so
    every prefetch is done before its batch is pinned."""
    with tiny_cache.connect() as conn:
        # Contents of their own (make_table's pages would share images with tc's).
        conn.execute("CREATE TABLE pf_t (id int PRIMARY KEY, v int, pad text) USING gsnap")
        conn.execute("INSERT INTO pf_t SELECT g, -g, repeat(md5((-g)::text), 6) "
                     "FROM generate_series(1, 40000) g")
        snap = val(conn, "SELECT gsnap_snapshot()")
        pages = val(conn, "SELECT pg_relation_size('pf_t') / 8192")
        conn.execute("SET max_parallel_workers_per_gather = 0")
        stats = "SELECT image_hits, image_loads FROM gsnap_index_stats()"
        hits, loads = conn.execute(stats).fetchone()
        total = val(conn, f"SELECT sum(length(md5(r::text || md5(r::text)))) "
                          f"FROM {asof('pf_t', snap)} r")
        assert total == 40000 * 32
        hits_after, loads_after = conn.execute(stats).fetchone()
        assert loads_after - loads >= pages - 32, "the snapshot's images were not all loaded"
        assert hits_after - hits >= pages - 64, (
            f"{hits_after - hits} of {pages} images pinned from the cache")
        conn.execute("RESET max_parallel_workers_per_gather")


PINS = "SELECT group_pins, image_pins FROM gsnap_index_stats()"


def test_readers_ended_mid_read_leave_no_pins(tiny_cache):
    """A reader that ends in the middle of a read gives back every pin it held in the image
    and group caches: terminated by pg_terminate_backend (a FATAL error ends the process from
    inside the wait that saw it, and Rust frames above the wait never unwind), cancelled by a
    statement_timeout, in a parallel query cancelled so (its workers are stopped by SIGTERM),
    or terminated while a cursor holds its scan. Then gsnap_index_stats() counts no pin and
    the snapshot reads as it was. Before each process released at exit what its guards still
    held, each terminated reader could leave a batch of slots pinned for good: with this
    smallest cache a few of them left no room, and every later read waited forever."""
    with tiny_cache.connect() as conn, tiny_cache.connect() as admin:
        conn.execute("CREATE TABLE pin_t (id int PRIMARY KEY, v int, pad text) USING gsnap")
        conn.execute("INSERT INTO pin_t SELECT g, g * 3, repeat(md5((g * 3)::text), 6) "
                     "FROM generate_series(1, 40000) g")
        snap = val(conn, "SELECT gsnap_snapshot()")
        truth = digest(conn, "pin_t")
        read = f"SELECT sum(length(md5(r::text))) FROM {asof('pin_t', snap)} r"
        full = max(measure(conn, read), measure(conn, read))
        parallel = ("SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;"
                    " SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 2")
        rng = random.Random(7)
        ended = {"terminate": 0, "cancel": 0, "parallel": 0}
        for i in range(24):
            how = ("terminate", "cancel", "parallel")[i % 3]
            delay = rng.uniform(0.05, 0.9) * full
            victim = tiny_cache.connect()
            timer = None
            if how == "terminate":
                pid = victim.info.backend_pid
                timer = threading.Timer(delay, admin.execute,
                                        ("SELECT pg_terminate_backend(%s)", (pid,)))
                timer.start()
            else:
                if how == "parallel":
                    victim.execute(parallel)
                victim.execute(f"SET statement_timeout = {max(1, int(delay * 1000))}")
            try:
                victim.execute(read).fetchall()
            except (psycopg.errors.QueryCanceled, psycopg.OperationalError):
                ended[how] += 1
            if timer is not None:
                timer.join()
            victim.close()
        assert all(n >= 3 for n in ended.values()), f"too few reads were ended to test: {ended}"
        # a cursor's scan in the middle of its batches, its backend terminated while idle
        victim = tiny_cache.connect()
        victim.execute("BEGIN")
        victim.execute(f"DECLARE k CURSOR FOR SELECT * FROM {asof('pin_t', snap)}")
        victim.execute("FETCH 5000 FROM k").fetchall()
        assert val(admin, "SELECT pg_terminate_backend(%s)", (victim.info.backend_pid,))
        victim.close()
        conn.execute("SET statement_timeout = '60s'")
        assert digest(conn, asof("pin_t", snap)) == truth
        conn.execute("RESET statement_timeout")
        try:
            wait_until(lambda: conn.execute(PINS).fetchone() == (0, 0), 15,
                       "no pin held in the caches once no read runs")
        except AssertionError:
            groups, images = conn.execute(PINS).fetchone()
            raise AssertionError(f"with no read running, {groups} group pin(s) and {images} "
                                 f"image pin(s) are held (ended: {ended})") from None


def test_signals_reaching_any_thread_of_the_worker_do_not_crash_it(tiny_cache):
    """A signal sent to the worker process may be delivered to any of its threads, RocksDB's
    included. Reloads (SIGHUP) fired at the worker while it captures and serves reads never
    take it (and with it the whole server) down, and still take effect."""
    import os
    import signal

    with tiny_cache.connect() as conn:
        make_table(conn, "sig_t", 40000)
        pid = progress(conn)["worker_pid"]
        log_from = len(tiny_cache.log())
        for _ in range(5):
            snap = val(conn, "SELECT gsnap_snapshot(false)")
            conn.execute("UPDATE sig_t SET v = v + 1 WHERE id % 3 = 0")
            for _ in range(300):
                os.kill(pid, signal.SIGHUP)
            assert val(conn, f"SELECT count(*) FROM {asof('sig_t', snap)}") == 40000
        crashes = [line for line in tiny_cache.log()[log_from:].splitlines()
                   if "terminated by signal" in line or "panicked" in line]
        assert not crashes, crashes
        assert progress(conn)["worker_pid"] == pid
        # the worker still rereads its settings on SIGHUP: periodic snapshots start
        last = val(conn, "SELECT max(snap_id) FROM gsnap_snapshots()")
        configure(conn, snapshot_interval=1)
        try:
            wait_until(lambda: val(conn, "SELECT max(snap_id) FROM gsnap_snapshots()") > last,
                       10, "a periodic snapshot after the reload")
        finally:
            configure(conn, snapshot_interval=None)
