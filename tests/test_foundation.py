"""Foundation: gsnap behaves like heap for whole-cluster workflows (pgbench, dump/restore),
and refuses to run without shared_preload_libraries."""

import re

import psycopg
import pytest

from cluster import Cluster


def table_am(conn, name):
    return conn.execute(
        "SELECT a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE c.oid = %s::regclass",
        (name,),
    ).fetchone()[0]


def test_preload_is_required_with_a_clear_error():
    c = Cluster("nopreload", preload=False).start()
    try:
        with c.connect() as conn:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as err:
                conn.execute("CREATE EXTENSION gsnap")
            assert "shared_preload_libraries" in str(err.value)
            assert "restart the server" in err.value.diag.message_hint
            # nothing was left half-created
            assert conn.execute("SELECT count(*) FROM pg_am WHERE amname = 'gsnap'").fetchone()[0] == 0
    finally:
        c.destroy()


def test_pgbench_runs_on_gsnap_tables(cluster, conn):
    env = {"PGOPTIONS": "-c default_table_access_method=gsnap"}
    try:
        cluster.run("pgbench", "-i", "-s", "2", "-q", env=env)
        for t in ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"):
            assert table_am(conn, t) == "gsnap"
        out = cluster.run("pgbench", "-c", "4", "-j", "2", "-T", "5", "-n", env=env).stdout
        processed = int(re.search(r"actually processed: (\d+)", out).group(1))
        assert processed > 100
        a, t, b, h = conn.execute(
            "SELECT (SELECT sum(abalance) FROM pgbench_accounts),"
            " (SELECT sum(tbalance) FROM pgbench_tellers),"
            " (SELECT sum(bbalance) FROM pgbench_branches),"
            " (SELECT count(*) FROM pgbench_history)"
        ).fetchone()
        assert a == t == b
        assert h == processed
        conn.execute("VACUUM ANALYZE pgbench_accounts")
    finally:
        conn.execute(
            "DROP TABLE IF EXISTS pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history"
        )


def test_dump_and_restore_keep_the_access_method(cluster, conn):
    conn.execute("DROP SCHEMA IF EXISTS dumped CASCADE")
    conn.execute("CREATE SCHEMA dumped")
    conn.execute("CREATE TABLE dumped.g (id int PRIMARY KEY, big text, j jsonb) USING gsnap")
    conn.execute("CREATE TABLE dumped.h (id int PRIMARY KEY, g int REFERENCES dumped.g) USING heap")
    conn.execute("CREATE INDEX ON dumped.g USING gin (j)")
    conn.execute(
        "INSERT INTO dumped.g SELECT i, repeat(md5(i::text), 500), jsonb_build_object('i', i)"
        " FROM generate_series(1, 300) i"
    )
    conn.execute("INSERT INTO dumped.h SELECT i, i FROM generate_series(1, 300) i")
    digest = "SELECT md5(string_agg(t::text, ',' ORDER BY id)) FROM dumped.g t"
    before = conn.execute(digest).fetchone()[0]

    for fmt in ("p", "c"):
        dump = cluster.run("pg_dump", "-n", "dumped", f"-F{fmt}", "-f", f"/tmp/gsnap-dump.{fmt}").returncode
        assert dump == 0
        if fmt == "p":
            text = open("/tmp/gsnap-dump.p").read()
            assert "default_table_access_method = gsnap" in text
        conn.execute("DROP SCHEMA dumped CASCADE")
        if fmt == "p":
            cluster.run("psql", "-v", "ON_ERROR_STOP=1", "-q", "-f", "/tmp/gsnap-dump.p")
        else:
            cluster.run("pg_restore", "-d", "postgres", "/tmp/gsnap-dump.c")
        assert table_am(conn, "dumped.g") == "gsnap"
        assert table_am(conn, "dumped.h") == "heap"
        assert conn.execute(digest).fetchone()[0] == before
        assert conn.execute("SELECT count(*) FROM dumped.h").fetchone()[0] == 300
    conn.execute("DROP SCHEMA dumped CASCADE")
