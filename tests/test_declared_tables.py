"""Which tables a snapshot declares: the worker keeps its list of gsnap tables between
declarations and reads pg_class again only after a change to it (src/worker/catalog.rs), so
every kind of change between two declarations must show in the second one."""


def snapshot(conn):
    return conn.execute("SELECT gsnap_snapshot()").fetchone()[0]


def declared(conn, snap):
    """The tables of this test that snapshot `snap` declared."""
    return {r[0] for r in conn.execute(
        "SELECT table_name FROM gsnap_snapshot_tables(%s) WHERE table_name LIKE 'public.dt\\_%%'",
        (snap,)).fetchall()}


def test_each_declaration_lists_the_gsnap_tables_of_its_moment(conn):
    conn.execute("CREATE TABLE dt_a (id int) USING gsnap")
    conn.execute("CREATE TABLE dt_b (id int) USING heap")
    conn.execute("INSERT INTO dt_a VALUES (1)")
    assert declared(conn, snapshot(conn)) == {"public.dt_a"}
    # Nothing changed in pg_class: the list kept from the last declaration.
    assert declared(conn, snapshot(conn)) == {"public.dt_a"}

    conn.execute("ALTER TABLE dt_b SET ACCESS METHOD gsnap")
    assert declared(conn, snapshot(conn)) == {"public.dt_a", "public.dt_b"}

    conn.execute("ALTER TABLE dt_a SET ACCESS METHOD heap")
    assert declared(conn, snapshot(conn)) == {"public.dt_b"}

    conn.execute("CREATE MATERIALIZED VIEW dt_mv USING gsnap AS SELECT 1 AS one")
    conn.execute("CREATE TABLE dt_c (id int) USING gsnap")
    assert declared(conn, snapshot(conn)) == {"public.dt_b", "public.dt_mv", "public.dt_c"}

    # A temporary gsnap table is never snapshotted; its creation changes pg_class all the same.
    conn.execute("CREATE TEMP TABLE dt_tmp (id int) USING gsnap")
    conn.execute("DROP TABLE dt_c")
    conn.execute("ALTER TABLE dt_b RENAME TO dt_b2")
    assert declared(conn, snapshot(conn)) == {"public.dt_b2", "public.dt_mv"}

    # Created and dropped inside one transaction, then a table created in a transaction
    # that rolls back: neither is ever declared.
    with conn.transaction():
        conn.execute("CREATE TABLE dt_gone (id int) USING gsnap")
        conn.execute("DROP TABLE dt_gone")
    try:
        with conn.transaction():
            conn.execute("CREATE TABLE dt_rolled_back (id int) USING gsnap")
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    assert declared(conn, snapshot(conn)) == {"public.dt_b2", "public.dt_mv"}

    for t in ("dt_a", "dt_b2", "dt_tmp"):
        conn.execute(f"DROP TABLE {t}")
    conn.execute("DROP MATERIALIZED VIEW dt_mv")
    assert declared(conn, snapshot(conn)) == set()
