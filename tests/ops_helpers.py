"""Helpers and fixtures shared by the operational tests (test_operations.py, test_ops_*.py)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import psycopg
import pytest
from psycopg.rows import dict_row

from cluster import Cluster, gsnap_cluster, reload_conf, wait_until  # noqa: F401 - wait_until is re-exported

PGBENCH_ENV = {"PGOPTIONS": "-c default_table_access_method=gsnap"}


@pytest.fixture(scope="module")
def ops():
    """A gsnap cluster of the module's own (its settings are changed with ALTER SYSTEM), with
    a small image cache (2 MB = 256 slots) so scans bigger than the cache are cheap to make."""
    yield from gsnap_cluster("ops", ["gsnap.image_cache_size = 2MB"])


def wait_server(cluster: Cluster, timeout: float = 60):
    """Waits until the server accepts connections and its gsnap worker is ready (after a
    crash of an earlier test, the server restarts)."""
    def ready():
        try:
            with cluster.connect() as c:
                p = progress(c)
                return p["worker"] == "ready"
        except psycopg.Error:
            return False
    wait_until(ready, timeout, "the server and its gsnap worker to be up", interval=0.5)


def val(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


def asof(table: str, snap) -> str:
    return f"gsnap_asof(NULL::{table}, {int(snap)})"


def digest(conn, rel_sql: str):
    """(row count, md5 of the sorted rows) of a table or a set-returning call."""
    return tuple(conn.execute(
        f"SELECT count(*), md5(coalesce(string_agg(r::text, '|' ORDER BY r::text), ''))"
        f" FROM {rel_sql} r"
    ).fetchone())


def measure(conn, sql) -> float:
    t = time.monotonic()
    cur = conn.execute(sql)
    if cur.description is not None:
        cur.fetchall()
    return time.monotonic() - t


def make_table(conn, name: str, rows: int):
    """A gsnap table of `rows` rows, about 35 rows per page."""
    conn.execute(f"DROP TABLE IF EXISTS {name}")
    conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int, pad text) USING gsnap")
    conn.execute(
        f"INSERT INTO {name} SELECT g, g, repeat(md5(g::text), 6) FROM generate_series(1, {rows}) g"
    )


def progress(conn) -> dict:
    return conn.cursor(row_factory=dict_row).execute("SELECT * FROM gsnap_progress()").fetchone()


def snapshots(conn) -> list[dict]:
    return conn.cursor(row_factory=dict_row).execute(
        "SELECT * FROM gsnap_snapshots() ORDER BY snap_id").fetchall()


def snapshot_row(conn, snap) -> dict | None:
    return conn.cursor(row_factory=dict_row).execute(
        "SELECT * FROM gsnap_snapshots() WHERE snap_id = %s", (snap,)).fetchone()


def configure(conn, **settings):
    """ALTER SYSTEM SET gsnap.<name> (None: RESET), reload, and wait until the worker has
    reread the configuration."""
    for k, v in settings.items():
        if v is None:
            conn.execute(f"ALTER SYSTEM RESET gsnap.{k}")
        else:
            conn.execute(f"ALTER SYSTEM SET gsnap.{k} = '{v}'")
    reload_conf(conn)


@contextmanager
def slow_capture(conn, pause_ms: int = 300, batch: int = 4):
    """Keeps captures in flight: `batch` pages every `pause_ms` (test hooks)."""
    configure(conn, debug_capture_pause_ms=pause_ms, capture_batch_pages=batch)
    try:
        yield
    finally:
        configure(conn, debug_capture_pause_ms=None, capture_batch_pages=None)


def in_flight(conn, snap):
    """The progress row if the capture of `snap` is under way (not finished), else None."""
    p = progress(conn)
    if p["snap_id"] == snap and p["pages_done"] < p["pages_total"]:
        row = snapshot_row(conn, snap)
        if row is not None and row["state"] == "capturing":
            return p
    return None


def wait_capturing(conn, snap, timeout: float = 15):
    return wait_until(lambda: in_flight(conn, snap), timeout,
                      f"the capture of snapshot {snap} to be in flight")


def wait_ready(conn, timeout: float, other_than=None) -> dict:
    return wait_until(
        lambda: (lambda p: p["worker"] == "ready" and p["worker_pid"] not in (None, other_than) and p)(
            progress(conn)),
        timeout, "the gsnap worker to be ready")


def wait_settled(conn, timeout: float) -> dict:
    """Waits until no snapshot is queued or being captured; returns {snap_id: state}."""
    def settled():
        p = progress(conn)
        if p["queued"] or p["phase"] not in ("idle",):
            return None
        states = {s["snap_id"]: s["state"] for s in snapshots(conn)}
        return None if "capturing" in states.values() else (states or {0: "none"})
    return wait_until(settled, timeout, "every declared snapshot to be captured", interval=0.2)


class Bg(threading.Thread):
    """Runs fn(conn) on a connection of its own in a thread, recording result, error, timing."""

    def __init__(self, cluster: Cluster, fn, **connect_kw):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.conn = cluster.connect(**connect_kw)
        self.pid = self.conn.info.backend_pid
        self.fn = fn
        self.result = None
        self.error: psycopg.Error | None = None
        self.started = time.monotonic()
        self.finished: float | None = None
        self.start()

    def run(self):
        try:
            self.result = self.fn(self.conn)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.finished = time.monotonic()

    def wait(self, timeout: float, what: str) -> "Bg":
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"{what}: still running after {timeout} s")
        return self

    def stop(self):
        """Ends the thread (terminating its backend if it still runs) and the connection."""
        if self.is_alive():
            try:
                with self.cluster.connect() as c:
                    c.execute("SELECT pg_terminate_backend(%s)", (self.pid,))
            except psycopg.Error:
                pass
            self.join(10)
        try:
            self.conn.close()
        except psycopg.Error:
            pass


def declare_in_background(cluster: Cluster) -> tuple[Bg, list[str]]:
    """gsnap_snapshot(false) on a connection of its own, in a thread; the NOTICEs its session
    gets while it waits are collected in the list returned with it."""
    told: list[str] = []

    def declare(c):
        c.add_notice_handler(lambda d: told.append(d.message_primary))
        return c.execute("SELECT gsnap_snapshot(false)").fetchone()[0]

    return Bg(cluster, declare), told


def drop_database(cluster: Cluster, name: str, timeout_s: int = 10) -> float:
    """DROP DATABASE IF EXISTS, bounded: returns how long it took; if it times out (a process
    that never accepts the ProcSignalBarrier DROP DATABASE waits for), the gsnap worker is
    terminated and the drop retried while it is down, and the timeout is re-raised."""
    with cluster.connect("template1") as admin:
        admin.execute(f"SET statement_timeout = '{timeout_s}s'")
        t = time.monotonic()
        try:
            admin.execute(f"DROP DATABASE IF EXISTS {name}")
            return time.monotonic() - t
        except psycopg.errors.QueryCanceled:
            admin.execute("RESET statement_timeout")
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE backend_type = 'gsnap worker'")
            admin.execute(f"DROP DATABASE IF EXISTS {name}")
            raise
