"""gsnap's ERRORs as clients see them (issue 12): no Rust backtrace in any field, whatever
the server's environment says about backtraces."""

import os

import psycopg
import pytest

from cluster import Cluster


def error_fields(e: psycopg.Error) -> list[str]:
    d = e.diag
    return [f for f in (d.message_primary, d.message_detail, d.message_hint, d.context) if f]


def test_errors_carry_no_rust_backtrace_when_the_server_runs_with_rust_backtrace_set():
    saved = os.environ.get("RUST_BACKTRACE")
    os.environ["RUST_BACKTRACE"] = "1"
    try:
        cluster = Cluster("backtrace").start()
    finally:
        if saved is None:
            del os.environ["RUST_BACKTRACE"]
        else:
            os.environ["RUST_BACKTRACE"] = saved
    try:
        environ = open(f"/proc/{cluster.postmaster_pid()}/environ", "rb").read().split(b"\0")
        assert b"RUST_BACKTRACE=1" in environ, "the server must really run with backtraces asked for"
        with cluster.connect() as conn:
            conn.execute("CREATE EXTENSION gsnap")
            conn.execute("CREATE TABLE early (id int) USING gsnap")
            conn.execute("INSERT INTO early VALUES (1)")
            snap = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
            conn.execute("CREATE TABLE later (id int) USING gsnap")
            queries = {
                # the custom scan: the ERROR crosses PostgreSQL's executor between two Rust frames
                f"SELECT * FROM gsnap_asof(NULL::later, {snap})": "42P01",
                f"SELECT * FROM gsnap_range(NULL::later, {snap}, {snap})": "42P01",
                # the function path and an error answered by the worker
                f"SELECT gsnap_asof(NULL::later, {snap})": "42P01",
                "SELECT * FROM gsnap_asof(NULL::early, 999999)": "22023",
                "SELECT gsnap_written_blocks(0)": "42P01",
            }
            for query, sqlstate in queries.items():
                with pytest.raises(psycopg.Error) as raised:
                    conn.execute(query)
                assert raised.value.sqlstate == sqlstate, query
                for field in error_fields(raised.value):
                    assert "backtrace" not in field.lower(), (query, field)
                    assert ".rs:" not in field, (query, field)
                    assert "   0: " not in field, (query, field)
    finally:
        cluster.destroy()
