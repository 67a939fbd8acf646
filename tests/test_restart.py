"""The first snapshot after a restart (issue 8, point 5; src/worker/restart.rs).

A new worker does not know which pages changed since the last durable snapshot S. It resumes
S's incarnation of each table whose storage is unchanged and examines only the blocks whose
page LSN is after S's (plus S's carried pages, blocks beyond S's size and pages no WAL record
set); unlogged tables are compared block by block. Every test checks the snapshots against
the live table (no writes in between) and that earlier snapshots read as before, after a
clean restart and after kill -9 under load, for logged and unlogged tables; and that the
shortcut was taken (the worker's log line: blocks read of total).
"""

import re
import subprocess
import threading
import time

import psycopg
import pytest

from cluster import PGBIN, SERVER_USER, Cluster, assert_private, wait_until
from workload import contents, digest, located_contents, describe_diff, wait_worker_ready

ROWS = 20_000


@pytest.fixture
def cluster():
    c = Cluster("restart", conf=["autovacuum = off", "max_prepared_transactions = 4"]).start()
    try:
        with c.connect() as conn:
            conn.execute("CREATE EXTENSION gsnap")
            conn.execute("CREATE TABLE big (id int PRIMARY KEY, v int NOT NULL, pad text) USING gsnap")
            conn.execute("CREATE UNLOGGED TABLE ul (id int PRIMARY KEY, v int NOT NULL) USING gsnap")
            conn.execute("INSERT INTO big SELECT i, 0, repeat(md5(i::text), 3) FROM generate_series(1, %s) i",
                         (ROWS,))
            conn.execute("INSERT INTO ul SELECT i, 0 FROM generate_series(1, 2000) i")
        yield c
    finally:
        c.destroy()


def snapshot_equals_live(conn, tables=("big", "ul")) -> int:
    snap = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
    for t in tables:
        live, where = located_contents(conn, t)
        got = contents(conn, t, snap)
        assert got == live, f"snapshot {snap} of {t} vs the live table:\n" + describe_diff(live, got, where)
    return snap


def first_capture_line(c: Cluster, snap: int) -> tuple[int, int, int]:
    """(blocks read, blocks in all, pages changed) from the worker's line about `snap`."""
    m = re.search(rf"snapshot {snap} is the first since the worker started: it read (\d+) of (\d+) "
                  r"blocks.*?; (\d+) pages changed", c.log())
    assert m, f"no line about the first capture since the start (snapshot {snap}) in the server log"
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def pages(conn, table: str) -> int:
    return conn.execute("SELECT pg_relation_size(%s::regclass) / 8192", (table,)).fetchone()[0]


def test_clean_restart_reads_only_what_changed(cluster):
    c = cluster
    with c.connect() as conn:
        # A transaction prepared before s1 that commits after the restart without writing a
        # page: only s1's carried pages say its rows must be read again.
        conn.execute("BEGIN")
        conn.execute("INSERT INTO big VALUES (%s, -1, 'prepared')", (ROWS + 1,))
        # (id 5500's page is written by nothing else below: only s1's carried list makes the
        # first capture after the restart read it again)
        conn.execute("UPDATE big SET v = -1 WHERE id = 5500")
        conn.execute("PREPARE TRANSACTION 'before_s1'")
        s1 = snapshot_equals_live(conn)
        d1 = {t: digest(conn, t, s1) for t in ("big", "ul")}
        # 0.1% of the rows, all over the table; the unlogged table too.
        conn.execute("UPDATE big SET v = v + 1 WHERE id % 1000 = 3")
        conn.execute("UPDATE ul SET v = v + 1 WHERE id % 50 = 1")
        # The tail deleted and truncated away, then partly written again: blocks s1 mapped
        # come back with other rows (or empty).
        conn.execute("DELETE FROM big WHERE id > %s AND id <= %s", (ROWS - 2000, ROWS))
        conn.execute("VACUUM big")
        conn.execute("INSERT INTO big SELECT i, 2, 'again' FROM generate_series(%s::int, %s::int) i",
                     (ROWS + 100, ROWS + 400))
        total = pages(conn, "big") + pages(conn, "ul")
    c.restart()
    wait_worker_ready(c)
    with c.connect() as conn:
        conn.execute("COMMIT PREPARED 'before_s1'")
        s2 = snapshot_equals_live(conn)
        assert {t: digest(conn, t, s1) for t in ("big", "ul")} == d1, "s1 reads differently after the restart"
        read, blocks, changed = first_capture_line(c, s2)
        assert blocks == total, f"the first capture visits every block ({blocks} of {total})"
        assert changed > 0
        # Read: the unlogged table in full, the pages written since s1 (about 40 updated and
        # their new versions, the truncated tail), s1's carried page.
        assert read < blocks / 2, f"too few blocks skipped by their LSN ({read} of {blocks} read)"
        # A second snapshot is incremental again, and equal to the live tables.
        conn.execute("UPDATE big SET v = v + 1 WHERE id = 42")
        snapshot_equals_live(conn)


def test_untouched_tables_are_not_read_after_a_restart(cluster):
    c = cluster
    with c.connect() as conn:
        conn.execute("CREATE TABLE cold (id int PRIMARY KEY, pad text) USING gsnap")
        conn.execute("INSERT INTO cold SELECT i, repeat('x', 200) FROM generate_series(1, 20000) i")
        # Hint bits set now, not by the capture (with data checksums, setting one after a
        # checkpoint writes a full-page image and so moves the page's LSN).
        conn.execute("VACUUM big, cold")
        conn.execute("CHECKPOINT")
        s1 = snapshot_equals_live(conn, ("big", "ul", "cold"))
        cold_pages = pages(conn, "cold")
        big_pages = pages(conn, "big")
        conn.execute("UPDATE big SET v = 5 WHERE id IN (1, 2, 3)")
    c.restart()
    wait_worker_ready(c)
    with c.connect() as conn:
        s2 = snapshot_equals_live(conn, ("big", "ul", "cold"))
        read, blocks, changed = first_capture_line(c, s2)
        ul_pages = pages(conn, "ul")
        # Read: the unlogged table, big's one page, and nothing of cold.
        assert read <= ul_pages + 3, (
            f"read {read} of {blocks} blocks; cold has {cold_pages}, big {big_pages}, ul {ul_pages}")
        assert changed >= 1
        assert digest(conn, "cold", s1) == digest(conn, "cold", s2)


def test_kill_9_under_load_then_the_first_snapshot_is_exact(cluster):
    c = cluster
    with c.connect() as conn:
        s1 = snapshot_equals_live(conn)
        d1 = {t: digest(conn, t, s1) for t in ("big", "ul")}
    stop = threading.Event()
    errors = []

    def writer(seed: int):
        try:
            with c.connect() as w:
                i = seed
                while not stop.is_set():
                    # The first 2000 rows only: the rest of big is untouched after s_mid.
                    i = (i * 7919 + 13) % 2000 + 1
                    w.execute("UPDATE big SET v = v + 1 WHERE id = %s", (i,))
                    w.execute("UPDATE ul SET v = v + 1 WHERE id = %s", (i % 2000 + 1,))
                    if i % 17 == 0:
                        w.execute("INSERT INTO big VALUES (%s, 0, 'x') ON CONFLICT DO NOTHING",
                                  (ROWS * 2 + i,))
        except psycopg.OperationalError:
            pass  # the crash
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    with c.connect() as conn:
        s_mid = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        d_mid = {t: digest(conn, t, s_mid) for t in ("big",)}
    time.sleep(1.0)
    c.crash()
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    c.start()
    wait_worker_ready(c)
    with c.connect() as conn:
        assert {t: digest(conn, t, s1) for t in ("big", "ul")} == d1
        assert {t: digest(conn, t, s_mid) for t in ("big",)} == d_mid
        # The unlogged table is empty after the crash; big holds what committed before it.
        assert conn.execute("SELECT count(*) FROM ul").fetchone()[0] == 0
        s2 = snapshot_equals_live(conn)
        read, blocks, _ = first_capture_line(c, s2)
        assert read < blocks / 2, f"too few blocks skipped by their LSN ({read} of {blocks} read)"
        conn.execute("UPDATE big SET v = 0 WHERE id < 100")
        conn.execute("INSERT INTO ul SELECT i, 1 FROM generate_series(1, 50) i")
        snapshot_equals_live(conn)


def test_snapshot_ids_run_on_across_a_clean_restart_and_are_never_reused_after_a_crash(cluster):
    """Snapshot ids come from a lease (32 at a time) and a declaration is written without
    waiting for the disk: a clean stop gives the rest of the lease back (no gap), a crash
    skips it; a snapshot declared just before a crash is failed or absent, never another
    snapshot's id."""
    c = cluster
    with c.connect() as conn:
        a = conn.execute("SELECT gsnap_snapshot(false)").fetchone()[0]
        b = snapshot_equals_live(conn)
        assert b == a + 1
    c.restart()
    wait_worker_ready(c)
    with c.connect() as conn:
        after_clean = snapshot_equals_live(conn)
        assert after_clean == b + 1, "a clean restart leaves no gap in the snapshot ids"
        conn.execute("UPDATE big SET v = v + 1 WHERE id % 100 = 7")
        lost = conn.execute("SELECT gsnap_snapshot(false)").fetchone()[0]
    c.crash()
    c.start()
    wait_worker_ready(c)
    with c.connect() as conn:
        listed = dict(conn.execute("SELECT snap_id, state FROM gsnap_snapshots()").fetchall())
        assert listed.get(lost) in (None, "failed", "committed"), listed
        new = snapshot_equals_live(conn)
        assert new > lost, f"snapshot id {new} after {lost}: an id was reused"
        now = {r[0] for r in conn.execute("SELECT snap_id FROM gsnap_snapshots()")}
        assert set(listed) | {new} == now
        if listed.get(lost) != "committed":
            # reading the lost or failed snapshot is an ERROR, never another snapshot's rows
            with pytest.raises(psycopg.Error):
                conn.execute(f"SELECT count(*) FROM gsnap_asof(NULL::big, {lost})")


def start_standby(primary: Cluster) -> Cluster:
    """A streaming standby of `primary`, made by pg_basebackup (-R: it follows the primary)."""
    s = Cluster("standby")
    s.data.mkdir(mode=0o700)
    subprocess.run(["chown", f"{SERVER_USER}:", str(s.data)], check=True)
    subprocess.run(["runuser", "-u", SERVER_USER, "--", str(PGBIN / "pg_basebackup"),
                    "-h", str(primary.data), "-p", str(primary.port), "-U", "postgres",
                    "-D", str(s.data), "-R", "-X", "stream", "-c", "fast"],
                   check=True, capture_output=True)
    # The copy has the primary's postgresql.conf: a later line wins.
    s.set_conf(f"port = {s.port}")
    s.set_conf(f"unix_socket_directories = '{s.data}'")
    return s.start()


def test_a_standby_refuses_snapshot_functions_at_once_and_a_promoted_one_reads_its_copy(cluster):
    """A streaming standby made by pg_basebackup: the store comes with the data directory, but
    it is not replicated, and the worker starts only when recovery ends. Every function that
    needs the worker fails at once with 55000 naming recovery (it used to wait for a worker that
    never comes), while live reads of gsnap tables follow the primary. Promoted, the standby
    reads the snapshots it was copied with as the primary does, and its first capture compares
    every block (a new timeline: page LSNs cannot vouch for anything) and equals the tables."""
    c = cluster
    with c.connect() as conn:
        s1 = snapshot_equals_live(conn)
        d1 = {t: digest(conn, t, s1) for t in ("big", "ul")}
        conn.execute("UPDATE big SET v = v + 1 WHERE id % 100 = 5")
        s = start_standby(c)
        try:
            live = digest(conn, "big")
            with s.connect() as sc:
                assert sc.execute("SELECT pg_is_in_recovery()").fetchone()[0]
                wait_until(lambda: digest(sc, "big") == live, 30, "the standby replays the update")
                for q in ("SELECT gsnap_snapshot()",
                          f"SELECT count(*) FROM gsnap_asof(NULL::big, {s1})",
                          "SELECT count(*) FROM gsnap_snapshots()",
                          "SELECT count(*) FROM gsnap_versions(NULL::big, 1, 100)",
                          f"SELECT gsnap_delete({s1})"):
                    t0 = time.monotonic()
                    with pytest.raises(psycopg.Error) as err:
                        sc.execute(q)
                    took = time.monotonic() - t0
                    assert err.value.sqlstate == "55000", (q, err.value.sqlstate, str(err.value))
                    assert "in recovery" in str(err.value), (q, str(err.value))
                    assert took < 5, f"{q} took {took:.1f} s to fail"
                assert sc.execute("SELECT worker FROM gsnap_progress()").fetchone()[0] == "in recovery"
            r = subprocess.run(["runuser", "-u", SERVER_USER, "--", str(PGBIN / "pg_ctl"), "-D",
                                str(s.data), "-w", "promote"], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            wait_worker_ready(s)
            with s.connect() as sc:
                assert {t: digest(sc, t, s1) for t in ("big", "ul")} == d1
                snap = snapshot_equals_live(sc)
                read, blocks, _ = first_capture_line(s, snap)
                assert read == blocks, f"a new timeline: every block is read ({read} of {blocks})"
            # The primary's own snapshots are untouched by the standby's.
            assert {t: digest(conn, t, s1) for t in ("big", "ul")} == d1
            snapshot_equals_live(conn)
        finally:
            s.destroy()


def committed(conn) -> set[int]:
    return {r[0] for r in conn.execute("SELECT snap_id FROM gsnap_snapshots() WHERE state = 'committed'")}


def test_a_copy_of_the_store_taken_under_load_restores_every_snapshot(cluster):
    """gsnap_copy_store() while writes and declarations run: the copy (a new directory, mode
    0700) is the store at one moment. Put in the store's place with the server stopped, it
    lists exactly the snapshots that were committed up to the newest one it returned, each
    reads as it did, nothing is missing (gsnap_verify), and the next snapshot, which starts from
    the copy's newest as after a restart, equals the tables."""
    c = cluster
    with c.connect() as conn:
        s1 = snapshot_equals_live(conn)
        stop = threading.Event()

        def load():
            with c.connect() as w:
                i = 0
                while not stop.is_set():
                    w.execute("UPDATE big SET v = v + 1 WHERE id %% 97 = %s", (i % 97,))
                    w.execute("UPDATE ul SET v = v + 1 WHERE id %% 13 = %s", (i % 13,))
                    if i % 3 == 0:
                        w.execute("SELECT gsnap_snapshot(false)")
                    i += 1

        writer = threading.Thread(target=load)
        writer.start()
        try:
            wait_until(lambda: max(committed(conn)) >= s1 + 3, 60, "snapshots under load")
            newest = conn.execute("SELECT gsnap_copy_store('store_copy')").fetchone()[0]
        finally:
            stop.set()
            writer.join()
        assert newest is not None and newest >= s1 + 3
        kept = {s for s in committed(conn) if s <= newest}
        digests = {s: {t: digest(conn, t, s) for t in ("big", "ul")} for s in kept}
        copy = c.data / "store_copy"
        assert_private(copy)
        assert f'store was copied to "{copy}"' in c.log()
    c.stop()
    (c.data / "gsnap").rename(c.data / "gsnap_before")
    copy.rename(c.data / "gsnap")
    c.start()
    wait_worker_ready(c)
    with c.connect() as conn:
        assert committed(conn) == kept
        for s, d in digests.items():
            assert {t: digest(conn, t, s) for t in ("big", "ul")} == d, f"snapshot {s} in the copy"
        missing = conn.execute("SELECT missing_images, missing_toast_values FROM gsnap_verify()").fetchone()
        assert missing == (0, 0)
        assert snapshot_equals_live(conn) > max(kept)


@pytest.mark.parametrize("directory, state", [
    ("store_copy", "58P02"),       # exists (made below)
    ("", "22023"),
    ("gsnap/inside", "22023"),     # inside the store
    ("store_copy/../gsnap/inside", "22023"),  # the same, by another path
    ("no_such_parent/copy", "58P01"),
    (None, "22004"),
])
def test_copying_the_store_to_a_bad_directory_is_refused(cluster, directory, state):
    c = cluster
    (c.data / "store_copy").mkdir(exist_ok=True)
    with c.connect() as conn:
        with pytest.raises(psycopg.Error) as err:
            conn.execute("SELECT gsnap_copy_store(%s)", (directory,))
        assert err.value.sqlstate == state, str(err.value)
    assert not (c.data / "gsnap" / "inside").exists()


def test_copying_the_store_needs_the_right_to_write_server_files(cluster):
    """gsnap_admin alone may not choose where the server writes (as COPY TO a file needs
    pg_write_server_files); a role with neither may not call it at all."""
    with cluster.connect() as conn:
        conn.execute("CREATE ROLE copier_admin IN ROLE gsnap_admin")
        conn.execute("CREATE ROLE copier_both IN ROLE gsnap_admin, pg_write_server_files")
        conn.execute("CREATE ROLE copier_none")
        for role, state in (("copier_admin", "42501"), ("copier_none", "42501")):
            conn.execute(f"SET ROLE {role}")
            with pytest.raises(psycopg.Error) as err:
                conn.execute("SELECT gsnap_copy_store('by_role')")
            assert err.value.sqlstate == state, (role, str(err.value))
            conn.execute("RESET ROLE")
        assert not (cluster.data / "by_role").exists()
        conn.execute("SET ROLE copier_both")
        conn.execute("SELECT gsnap_copy_store('by_role')")
        conn.execute("RESET ROLE")
        assert (cluster.data / "by_role").is_dir()
