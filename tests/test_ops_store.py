"""The store directory when things go wrong: missing, not writable by the server, full,
belonging to another cluster. One cluster is restarted with a different
gsnap.store_directory for each case (the setting needs a restart)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from cluster import SERVER_USER, Cluster, assert_private, gsnap_cluster, server_uid
from ops_helpers import (
    asof,
    digest,
    make_table,
    progress,
    snapshot_row,
    val,
    wait_ready,
    wait_until,
)

@pytest.fixture(scope="module")
def stc():
    yield from gsnap_cluster("store")


def use_store(c: Cluster, directory: str):
    """Restarts `c` with gsnap.store_directory = directory."""
    c.stop()
    c.set_conf(f"gsnap.store_directory = '{directory}'")
    c.start()


def worker_state(conn, states, timeout=15):
    return wait_until(lambda: (lambda p: p["worker"] in states and p)(progress(conn)), timeout,
                      f"gsnap_progress().worker in {states}")


def ensure_st_t(conn):
    if val(conn, "SELECT to_regclass('st_t') IS NULL"):
        make_table(conn, "st_t", 500)


def snapshot_works(conn, table="st_t"):
    ensure_st_t(conn)
    snap = val(conn, "SELECT gsnap_snapshot()")
    assert snapshot_row(conn, snap)["state"] == "committed"
    assert digest(conn, asof(table, snap)) == digest(conn, table)
    return snap


def test_missing_store_directories_are_created_private(cluster, stc):
    """The default $PGDATA/gsnap and a configured directory that does not exist yet (with
    missing parents; relative = under the data directory) are created with mode 0700, owned
    by the server's OS user, and work."""
    with cluster.connect() as conn:
        wait_ready(conn, 15)
    assert_private(cluster.data / "gsnap")

    use_store(stc, "stores/new/deeper")
    with stc.connect() as conn:
        wait_ready(conn, 15)
        make_table(conn, "st_t", 500)
        snapshot_works(conn)
    for p in ("stores", "stores/new", "stores/new/deeper"):
        assert_private(stc.data / p)

    parent = stc.base / "absolute"
    parent.mkdir()
    os.chown(parent, server_uid(), -1)
    use_store(stc, str(parent / "store"))
    with stc.connect() as conn:
        wait_ready(conn, 15)
        snapshot_works(conn)
    assert_private(parent / "store")


def test_store_directory_of_another_cluster_is_refused(cluster, stc):
    """A copy of another cluster's store: a clear ERROR naming the problem, the worker reports
    'store unavailable', the server keeps running."""
    with cluster.connect() as conn:
        wait_ready(conn, 15)  # its store exists (created when its worker started)
    foreign = stc.base / "foreign"
    shutil.copytree(cluster.data / "gsnap", foreign, ignore=shutil.ignore_patterns("LOCK"))
    subprocess.run(["chown", "-R", f"{SERVER_USER}:", str(foreign)], check=True)
    os.chmod(foreign, 0o700)
    use_store(stc, str(foreign))
    with stc.connect() as conn:
        worker_state(conn, ("store unavailable", "ready"))
        assert progress(conn)["worker"] == "store unavailable"
        with pytest.raises(psycopg.Error) as err:
            conn.execute("SELECT gsnap_snapshot()")
        print(f"[ops] foreign store: {err.value.sqlstate} {err.value}")
        assert "belongs to another PostgreSQL cluster" in str(err.value)
        assert str(foreign) in str(err.value)
        assert err.value.sqlstate == "55000"
        assert val(conn, "SELECT 1") == 1
    assert "belongs to another PostgreSQL cluster" in stc.log()


def test_unwritable_store_directory_fails_clearly_and_recovers(stc):
    """A store directory the server cannot use (owned by root, mode 0700): gsnap_snapshot()
    fails with a clear ERROR naming the directory (42501/58030), gsnap_progress() says 'store
    unavailable', the server runs on; after chown the worker opens it without a restart."""
    d = stc.base / "rootstore"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)  # root-owned
    use_store(stc, str(d))
    with stc.connect() as conn:
        worker_state(conn, ("store unavailable", "ready"))
        assert progress(conn)["worker"] == "store unavailable"
        for sql in ("SELECT gsnap_snapshot()", "SELECT gsnap_snapshot(false)",
                    "SELECT count(*) FROM gsnap_snapshots()"):
            with pytest.raises(psycopg.Error) as err:
                conn.execute(sql)
            print(f"[ops] unwritable store, {sql}: {err.value.sqlstate} {err.value}")
            assert err.value.sqlstate in ("42501", "58030"), err.value
            assert str(d) in str(err.value), err.value
        ensure_st_t(conn)
        assert val(conn, "SELECT count(*) FROM st_t") == 500, "the server must keep working"
        conn.execute("INSERT INTO st_t VALUES (-1, -1, 'while the store is unavailable')")
        assert str(d) in stc.log()

        os.chown(d, server_uid(), -1)
        t0 = time.monotonic()
        worker_state(conn, ("ready",), timeout=15)
        print(f"[ops] unwritable store: ready {time.monotonic() - t0:.1f} s after chown")
        snapshot_works(conn)
        assert_private(d)


def _mount_small_fs(mnt: Path, size_mb: int) -> str | None:
    """Mounts a small file system on mnt: tmpfs, else a loop-mounted ext4 image. Returns how,
    or None if this machine allows neither."""
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(mnt)],
                       capture_output=True)
    if r.returncode == 0:
        return "tmpfs"
    img = mnt.parent / "small.img"
    try:
        subprocess.run(["truncate", "-s", f"{size_mb}M", str(img)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-m", "0", str(img)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True, capture_output=True)
        return "ext4 loop image"
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None


def test_full_disk_fails_the_snapshot_and_recovers(stc):
    """The store's file system fills up during a capture: that snapshot fails at once with
    SQLSTATE 53100, the server keeps running, every gsnap call answers promptly (with the data,
    or with 53100 while the store cannot be reopened), and once space is freed the worker
    reopens the store by itself: new snapshots work, the failed one is listed as failed with
    the real reason and refuses to be read, the earlier one reads as before."""
    mnt = stc.base / "smallfs"
    how = _mount_small_fs(mnt, 96)
    if how is None:
        pytest.skip("this machine can mount neither a tmpfs nor a loop device")
    filler = mnt / "filler"
    log_from = len(stc.log())
    try:
        os.chown(mnt, server_uid(), -1)
        os.chmod(mnt, 0o700)
        use_store(stc, str(mnt / "store"))
        with stc.connect() as conn:
            wait_ready(conn, 15)
            s1 = snapshot_works(conn)
            d1 = digest(conn, "st_t")
            # leave about 2 MB free, then write ~36 MB of incompressible rows: more than the
            # store's memtables and the log space RocksDB preallocated can take without a
            # new file
            free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
            with open(filler, "wb") as f:
                left = free - 2 * 1024 * 1024
                while left > 0:
                    n = min(left, 1 << 20)
                    f.write(os.urandom(n))
                    left -= n
            conn.execute("DROP TABLE IF EXISTS st_big")
            conn.execute("CREATE TABLE st_big (id int, pad text) USING gsnap")
            conn.execute(
                "INSERT INTO st_big SELECT g, (SELECT string_agg(md5(random()::text || i || g), '')"
                " FROM generate_series(1, 30) i) FROM generate_series(1, 36000) g")
            conn.execute("SET statement_timeout = '60s'")
            t0 = time.monotonic()
            with pytest.raises(psycopg.Error) as err:
                conn.execute("SELECT gsnap_snapshot()")
            print(f"[ops] full disk ({how}): after {time.monotonic() - t0:.1f} s: "
                  f"{err.value.sqlstate} {err.value}")
            assert not isinstance(err.value, psycopg.errors.QueryCanceled), "the snapshot hung on a full disk"
            assert err.value.sqlstate == "53100", err.value
            failed = s1 + 1
            assert val(conn, "SELECT 1") == 1

            # While the disk is full every call answers at once: with its data, or with 53100.
            conn.execute("SET statement_timeout = '5s'")
            calls = {
                "listing": "SELECT count(*) FROM gsnap_snapshots()",
                "AS OF the earlier snapshot": f"SELECT count(*) FROM {asof('st_t', s1)}",
                "AS OF the failed snapshot": f"SELECT count(*) FROM {asof('st_big', failed)}",
                "a new snapshot": "SELECT gsnap_snapshot()",
            }
            for what, sql in calls.items():
                try:
                    got = val(conn, sql)
                    print(f"[ops] full disk: {what} while full: {got}")
                    assert what in ("listing", "AS OF the earlier snapshot"), \
                        f"{what} succeeded on a full disk: {got}"
                except psycopg.errors.QueryCanceled:
                    pytest.fail(f"{what} waits on a full disk")
                except psycopg.Error as e:
                    print(f"[ops] full disk: {what} while full: {e.sqlstate} {e}")
                    assert e.sqlstate in ("53100", "55000", "22023"), e

            filler.unlink()
            t0 = time.monotonic()
            snap, last = None, None
            while time.monotonic() - t0 < 15:
                try:
                    snap = val(conn, "SELECT gsnap_snapshot()")
                    break
                except psycopg.Error as e:
                    last = e
                    time.sleep(0.5)
            assert snap is not None, (f"no snapshot works 15 s after space was freed; last error: "
                                      f"{last.sqlstate} {last}")
            print(f"[ops] full disk: a snapshot worked {time.monotonic() - t0:.1f} s after freeing"
                  f" space (last error before: {last})")
            state, failure = conn.execute(
                "SELECT state, failure FROM gsnap_snapshots() WHERE snap_id = %s", (failed,)).fetchone()
            print(f"[ops] full disk: snapshot {failed} is {state}: {failure}")
            assert state == "failed" and "space" in failure.lower(), (state, failure)
            with pytest.raises(psycopg.Error) as err:
                val(conn, f"SELECT count(*) FROM {asof('st_big', failed)}")
            assert "failed" in str(err.value), err.value
            assert digest(conn, asof("st_big", snap)) == digest(conn, "st_big")
            assert digest(conn, asof("st_t", snap)) == digest(conn, "st_t")
            assert digest(conn, asof("st_t", s1)) == d1
            conn.execute("DROP TABLE st_big")
            warnings = [line for line in stc.log()[log_from:].splitlines() if "WARNING" in line]
            for line in warnings[:3]:
                print(f"[ops] full disk log: {line[:300]}")
    finally:
        stc.stop()
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
