"""Partitioned tables as of a snapshot (issue 10, point 3): gsnap_asof, gsnap_range,
gsnap_versions, gsnap_diff and gsnap_restore of a partitioned table read the partitions it had
at each snapshot, detached and dropped ones included, each in its own recorded layout, into
the partitioned table's columns now; the AS OF scan prunes partitions the query's conditions
exclude.

Differential: random DML over a partitioned table (rows moving between partitions, partitions
of different physical layouts, a sub-partitioned partition, a default partition), a snapshot
after each round with the live rows kept as the truth; then DETACH, DROP, ATTACH, a column
added and one renamed; every snapshot still reads its truth, through the custom scan and the
function scan, with and without conditions that prune; diffs and restores match the truths.
"""

import random
from collections import Counter

import psycopg
import pytest

from cluster import gsnap_cluster, snapshot, rows, sqlstate


@pytest.fixture(scope="module")
def cluster():
    yield from gsnap_cluster("partitioned")


@pytest.fixture()
def conn(cluster):
    with cluster.connect() as c:
        c.autocommit = True
        yield c


def make_tree(conn, name: str, keyed: bool) -> None:
    """name partitioned by range of id: [0, 1000) a plain partition, [1000, 2000) one attached
    with its columns in another order and a dropped column, [2000, 3000) sub-partitioned by
    list of region, and a default partition."""
    key = ", PRIMARY KEY (id, region)" if keyed else ""
    conn.execute(f"CREATE TABLE {name} (id int NOT NULL, region text NOT NULL, v int, note text{key}) "
                 "PARTITION BY RANGE (id)")
    conn.execute(f"CREATE TABLE {name}_a PARTITION OF {name} FOR VALUES FROM (0) TO (1000) USING gsnap")
    conn.execute(f"CREATE TABLE {name}_b (note text, junk int, v int, region text NOT NULL, id int NOT NULL) "
                 "USING gsnap")
    conn.execute(f"ALTER TABLE {name}_b DROP COLUMN junk")
    if keyed:
        conn.execute(f"ALTER TABLE {name}_b ADD PRIMARY KEY (id, region)")
    conn.execute(f"ALTER TABLE {name} ATTACH PARTITION {name}_b FOR VALUES FROM (1000) TO (2000)")
    conn.execute(f"CREATE TABLE {name}_c PARTITION OF {name} FOR VALUES FROM (2000) TO (3000) "
                 "PARTITION BY LIST (region)")
    conn.execute(f"CREATE TABLE {name}_c_eu PARTITION OF {name}_c FOR VALUES IN ('eu') USING gsnap")
    conn.execute(f"CREATE TABLE {name}_c_us PARTITION OF {name}_c FOR VALUES IN ('us') USING gsnap")
    conn.execute(f"CREATE TABLE {name}_d PARTITION OF {name} DEFAULT USING gsnap")


def scramble(conn, name: str, rng: random.Random, n: int) -> None:
    for _ in range(n):
        op, i = rng.random(), rng.randrange(0, 4000)
        region = rng.choice(["eu", "us"])
        if op < 0.45:
            conn.execute(f"INSERT INTO {name} VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                         (i, region, rng.randrange(100), "x" * rng.choice([1, 3000])))
        elif op < 0.65:
            conn.execute(f"UPDATE {name} SET v = v + 1 WHERE id = %s", (i,))
        elif op < 0.8:
            # moves rows between partitions (and sub-partitions)
            conn.execute(f"UPDATE {name} SET id = (id + 1000) %% 4000, region = %s "
                         f"WHERE id = %s AND NOT EXISTS (SELECT FROM {name} "
                         "WHERE id = (%s + 1000) %% 4000 AND region = %s)", (region, i, i, region))
        else:
            conn.execute(f"DELETE FROM {name} WHERE id = %s", (i,))


def truth_rows(conn, name: str) -> Counter:
    return rows(conn, f"SELECT id, region, v, note FROM {name}")


def test_a_partitioned_table_reads_the_partitions_it_had_at_each_snapshot(conn):
    rng = random.Random(3)
    make_tree(conn, "pt", keyed=True)
    truths = {}
    for _ in range(4):
        scramble(conn, "pt", rng, 150)
        truths[snapshot(conn)] = truth_rows(conn, "pt")
    first = min(truths)
    # The listing says which partitioned table each partition belonged to.
    listed = dict(conn.execute("SELECT table_name, partition_of::regclass::text FROM gsnap_snapshot_tables(%s) "
                               "WHERE table_name LIKE 'public.pt%%'", (first,)).fetchall())
    assert listed == {"public.pt_a": "pt", "public.pt_b": "pt", "public.pt_c_eu": "pt_c",
                      "public.pt_c_us": "pt_c", "public.pt_d": "pt"}, listed
    # What changes since: a partition detached, one dropped, a new one attached, a column
    # added and one renamed.
    conn.execute("ALTER TABLE pt DETACH PARTITION pt_b")
    conn.execute("DROP TABLE pt_c_us")
    conn.execute("CREATE TABLE pt_e PARTITION OF pt FOR VALUES FROM (5000) TO (6000) USING gsnap")
    conn.execute("INSERT INTO pt VALUES (5001, 'eu', 1, 'new')")
    conn.execute("ALTER TABLE pt ADD COLUMN extra int")
    conn.execute("ALTER TABLE pt RENAME COLUMN v TO value")
    for s, truth in truths.items():
        want = Counter({(i, r, v, n, None): c for (i, r, v, n), c in truth.items()})
        assert rows(conn, "SELECT * FROM gsnap_asof(NULL::pt, %s)", s) == want, s
        # the function scan returns the same rows
        assert rows(conn, "SELECT id, region, value, note, extra FROM gsnap_asof(NULL::pt, %s) WITH ORDINALITY",
                    s) == want, s
        # conditions that prune return what a full read filtered returns
        for cond in ("id < 1000", "id >= 1000 AND id < 2000", "id = 2500 AND region = 'us'",
                     "region = 'eu' AND id BETWEEN 2000 AND 2999", "id > 4000", "id IN (5, 1005, 3005)"):
            pruned = rows(conn, f"SELECT * FROM gsnap_asof(NULL::pt, %s) WHERE {cond}", s)
            full = rows(conn, f"SELECT * FROM (SELECT * FROM gsnap_asof(NULL::pt, %s) WITH ORDINALITY) x "
                              f"WHERE {cond}", s)
            full = Counter({k[:-1]: c for k, c in full.items()})
            assert pruned == full, (s, cond)
    def partitions_read(cond: str) -> str:
        plan = [r[0] for r in conn.execute(
            f"EXPLAIN ANALYZE SELECT * FROM gsnap_asof(NULL::pt, %s) WHERE {cond}", (first,))]
        return next(line.split(": ")[1] for line in plan if "Partitions Read" in line)

    # the default partition holds negative ids too: only a lower bound excludes it
    assert partitions_read("id < 1000") == "2 of 5 at the snapshot"
    assert partitions_read("id >= 0 AND id < 1000") == "1 of 5 at the snapshot"
    assert partitions_read("id = 2500 AND region = 'us'") == "1 of 5 at the snapshot"
    assert partitions_read("id >= 2000 AND id < 3000") == "2 of 5 at the snapshot"
    assert partitions_read("true") == "5 of 5 at the snapshot"
    # A generic plan's parameters prune nothing, and the answer is the same.
    conn.execute("PREPARE pq(int) AS SELECT count(*) FROM gsnap_asof(NULL::pt, %s) WHERE id < $1" % first)
    want = sum(c for (i, *_), c in truths[first].items() if i < 1000)
    for _ in range(7):
        assert conn.execute("EXECUTE pq(1000)").fetchone()[0] == want
    # Over a range: each snapshot's rows, through the scan and the function; the versions,
    # each expanded over its run of snapshots, give the same rows; counts per snapshot.
    snaps = sorted(truths)
    first_last = (snaps[0], snaps[-1])
    want_at = {s: Counter({(*k, None): c for k, c in t.items()}) for s, t in truths.items()}
    for form in ("", " WITH ORDINALITY"):
        got = conn.execute(f"SELECT snap_id, (rec).* FROM gsnap_range(NULL::pt, %s, %s){form}",
                           first_last).fetchall()
        for s in snaps:
            assert Counter(r[1:6] for r in got if r[0] == s) == want_at[s], (form, s)
        runs = conn.execute(f"SELECT first_snap, last_snap, (rec).* FROM gsnap_versions(NULL::pt, %s, %s){form}",
                            first_last).fetchall()
        for s in snaps:
            assert Counter(r[2:7] for r in runs if r[0] <= s <= r[1]) == want_at[s], (form, s)
    # Conditions on rec prune partitions over the range too, per snapshot; same answers.
    for cond in ("(rec).id >= 0 AND (rec).id < 1000", "(rec).id = 2500 AND (rec).region = 'us'",
                 "(rec).id > 4000", "(rec).region = 'eu' AND (rec).id BETWEEN 2000 AND 2999"):
        for reader, cols in (("gsnap_range", "snap_id"), ("gsnap_versions", "first_snap, last_snap")):
            pruned = rows(conn, f"SELECT {cols}, (rec).* FROM {reader}(NULL::pt, %s, %s) WHERE {cond}",
                          *first_last)
            full = rows(conn, f"SELECT {cols}, (rec).* FROM {reader}(NULL::pt, %s, %s) WITH ORDINALITY "
                              f"WHERE {cond}", *first_last)
            assert pruned == full, (reader, cond)
    plan = [r[0] for r in conn.execute(
        "EXPLAIN ANALYZE SELECT * FROM gsnap_range(NULL::pt, %s, %s) WHERE (rec).id >= 0 AND (rec).id < 1000",
        first_last)]
    assert any("Partitions Read: 1 of 5 over the range" in line for line in plan), plan
    counts = dict(conn.execute("SELECT snap_id, count(*) FROM gsnap_range(NULL::pt, %s, %s) GROUP BY 1",
                               first_last).fetchall())
    assert counts == {s: sum(t.values()) for s, t in truths.items()}
    # The planner estimates the rows from the partitions' statistics (the partitioned
    # table itself has none).
    conn.execute("ANALYZE pt")
    live = conn.execute("SELECT count(*) FROM pt").fetchone()[0]
    plan = conn.execute("EXPLAIN SELECT * FROM gsnap_asof(NULL::pt, %s)", (first,)).fetchone()[0]
    estimate = int(plan.split("rows=")[1].split()[0])
    assert live / 2 <= estimate <= live * 2, (plan, live)
    # An intermediate partitioned table reads its own partitions.
    want_c = Counter({(*k, None): c for k, c in truths[first].items() if 2000 <= k[0] < 3000})
    assert rows(conn, "SELECT * FROM gsnap_asof(NULL::pt_c, %s)", first) == want_c


def test_diff_of_a_partitioned_table(conn):
    rng = random.Random(5)
    make_tree(conn, "pd", keyed=False)
    scramble(conn, "pd", rng, 200)
    a, ta = snapshot(conn), truth_rows(conn, "pd")
    scramble(conn, "pd", rng, 200)
    conn.execute("ALTER TABLE pd DETACH PARTITION pd_d")  # its rows leave the table
    b, tb = snapshot(conn), truth_rows(conn, "pd")
    got_added = rows(conn, "SELECT (rec).id, (rec).region, (rec).v, (rec).note FROM gsnap_diff(NULL::pd, %s, %s) "
                           "WHERE change = 'added'", a, b)
    got_removed = rows(conn, "SELECT (rec).id, (rec).region, (rec).v, (rec).note FROM gsnap_diff(NULL::pd, %s, %s) "
                             "WHERE change = 'removed'", a, b)
    assert got_added == tb - ta
    assert got_removed == ta - tb
    assert sum(got_removed.values()) > 0 and sum(got_added.values()) > 0


@pytest.mark.parametrize("keyed", [True, False], ids=["primary key", "no key"])
def test_restore_of_a_partitioned_table(conn, keyed):
    rng = random.Random(7 + keyed)
    t = "pr_k" if keyed else "pr_n"
    make_tree(conn, t, keyed=keyed)
    conn.execute(f"CREATE FUNCTION {t}_audit() RETURNS trigger LANGUAGE plpgsql AS "
                 "$$ BEGIN RAISE EXCEPTION 'trigger fired'; END $$")
    scramble(conn, t, rng, 200)
    s, truth = snapshot(conn), truth_rows(conn, t)
    scramble(conn, t, rng, 200)
    conn.execute(f"CREATE TRIGGER audit BEFORE INSERT OR UPDATE OR DELETE ON {t} "
                 f"FOR EACH ROW EXECUTE FUNCTION {t}_audit()")
    live = truth_rows(conn, t)
    assert live != truth
    conn.execute("BEGIN")
    d, u, i = conn.execute(f"SELECT * FROM gsnap_restore('{t}', %s)", (s,)).fetchone()
    assert truth_rows(conn, t) == truth
    conn.execute("ROLLBACK")
    assert truth_rows(conn, t) == live
    conn.execute(f"SELECT * FROM gsnap_restore('{t}', %s)", (s,))
    assert truth_rows(conn, t) == truth
    if keyed:
        assert u > 0
    assert d + u + i > 0
    # the trigger (cloned onto every partition) is on again
    assert sqlstate(conn, f"DELETE FROM {t} WHERE id = (SELECT min(id) FROM {t})") == "P0001"


def test_what_partitioned_tables_refuse(conn):
    conn.execute("CREATE TABLE ph (id int) PARTITION BY RANGE (id)")
    conn.execute("CREATE TABLE ph_1 PARTITION OF ph FOR VALUES FROM (0) TO (10) USING gsnap")
    conn.execute("CREATE TABLE ph_2 PARTITION OF ph FOR VALUES FROM (10) TO (20)")  # heap
    conn.execute("INSERT INTO ph VALUES (1), (11)")
    s = snapshot(conn)
    for q in ("SELECT * FROM gsnap_asof(NULL::ph, %s)", "SELECT * FROM gsnap_asof(NULL::ph, %s) WITH ORDINALITY",
              "SELECT * FROM gsnap_diff(NULL::ph, %s, %s)", "SELECT * FROM gsnap_restore('ph', %s)"):
        args = (s, s) if q.count("%s") == 2 else (s,)
        with pytest.raises(psycopg.Error) as e:
            conn.execute(q, args)
        assert e.value.sqlstate == "0A000" and "ph_2" in e.value.diag.message_primary, q
    conn.execute("ALTER TABLE ph_2 SET ACCESS METHOD gsnap")
    s2 = snapshot(conn)
    assert sorted(conn.execute("SELECT * FROM gsnap_asof(NULL::ph, %s)", (s2,)).fetchall()) == [(1,), (11,)]
    # a snapshot taken before the table had any partition holds none of its rows
    conn.execute("CREATE TABLE pe (id int) PARTITION BY RANGE (id)")
    s3 = snapshot(conn)
    assert conn.execute("SELECT count(*) FROM gsnap_asof(NULL::pe, %s)", (s3,)).fetchone()[0] == 0


def test_a_dropped_partition_comes_back_as_a_table_and_says_how_to_attach_it(conn):
    conn.execute("CREATE TABLE pu (id int, v text) PARTITION BY RANGE (id)")
    conn.execute("CREATE TABLE pu_1 PARTITION OF pu FOR VALUES FROM (0) TO (100) USING gsnap")
    conn.execute("INSERT INTO pu SELECT g, 'v' || g FROM generate_series(0, 99) g")
    s = snapshot(conn)
    conn.execute("DROP TABLE pu_1")
    seen: list[str] = []
    conn.add_notice_handler(lambda d: seen.append(d.message_primary))
    assert conn.execute("SELECT gsnap_undrop('pu_1', %s)", (s,)).fetchone()[0] == 100
    attach = next(n for n in seen if "ATTACH PARTITION" in n)
    assert "ALTER TABLE public.pu ATTACH PARTITION public.pu_1 FOR VALUES FROM (0) TO (100)" in attach
    conn.execute("ALTER TABLE public.pu ATTACH PARTITION public.pu_1 FOR VALUES FROM (0) TO (100)")
    assert conn.execute("SELECT count(*), min(v) FROM pu").fetchone() == (100, "v0")
    # and the partitioned table read at the snapshot still finds the dropped partition
    assert conn.execute("SELECT count(*) FROM gsnap_asof(NULL::pu, %s)", (s,)).fetchone()[0] == 100


def test_a_partition_detached_for_a_while_has_two_runs_of_versions(conn):
    conn.execute("CREATE TABLE pg (id int, v text) PARTITION BY RANGE (id)")
    conn.execute("CREATE TABLE pg_1 PARTITION OF pg FOR VALUES FROM (0) TO (10) USING gsnap")
    conn.execute("CREATE TABLE pg_2 PARTITION OF pg FOR VALUES FROM (10) TO (20) USING gsnap")
    conn.execute("INSERT INTO pg VALUES (1, 'one'), (11, 'eleven')")
    s1 = snapshot(conn)
    conn.execute("ALTER TABLE pg DETACH PARTITION pg_2")
    s2 = snapshot(conn)
    s3 = snapshot(conn)
    conn.execute("ALTER TABLE pg ATTACH PARTITION pg_2 FOR VALUES FROM (10) TO (20)")
    s4 = snapshot(conn)
    runs = sorted(conn.execute("SELECT first_snap, last_snap, (rec).id FROM gsnap_versions(NULL::pg, %s, %s)",
                               (s1, s4)).fetchall())
    assert runs == sorted([(s1, s4, 1), (s1, s1, 11), (s4, s4, 11)])
    at = conn.execute("SELECT snap_id, count(*) FROM gsnap_range(NULL::pg, %s, %s) GROUP BY 1 ORDER BY 1",
                      (s1, s4)).fetchall()
    assert at == [(s1, 2), (s2, 1), (s3, 1), (s4, 2)]


def test_the_planner_estimates_rows_of_tables_never_analyzed(conn):
    """An AS OF scan of a table never analyzed is estimated from its size, as PostgreSQL
    estimates the live table (it used to be one row, which misplans joins)."""
    conn.execute("CREATE TABLE pn (id int, v text) USING gsnap WITH (autovacuum_enabled = off)")
    conn.execute("INSERT INTO pn SELECT g, 'v' || g FROM generate_series(1, 20000) g")
    s = snapshot(conn)
    live = conn.execute("EXPLAIN SELECT * FROM pn").fetchone()[0]
    asof = conn.execute("EXPLAIN SELECT * FROM gsnap_asof(NULL::pn, %s)", (s,)).fetchone()[0]
    estimate = int(asof.split("rows=")[1].split()[0])
    assert estimate == int(live.split("rows=")[1].split()[0]) and 10000 <= estimate <= 40000, (live, asof)


def test_row_security_and_column_grants_of_the_partitioned_table_apply(cluster, conn):
    """Reading a partitioned table as of a snapshot needs what reading it now needs: its own
    grants (not the partitions'), and its policies applied to the partitions' old rows."""
    conn.execute("CREATE TABLE ps (id int, region text, secret text) PARTITION BY LIST (region)")
    conn.execute("CREATE TABLE ps_eu PARTITION OF ps FOR VALUES IN ('eu') USING gsnap")
    conn.execute("CREATE TABLE ps_us PARTITION OF ps FOR VALUES IN ('us') USING gsnap")
    conn.execute("INSERT INTO ps SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, 's' || g "
                 "FROM generate_series(1, 40) g")
    conn.execute("CREATE ROLE ps_reader LOGIN")
    conn.execute("GRANT SELECT (id, region) ON ps TO ps_reader")
    conn.execute("ALTER TABLE ps ENABLE ROW LEVEL SECURITY")
    conn.execute("CREATE POLICY eu_only ON ps FOR SELECT USING (region = 'eu')")
    a = snapshot(conn)
    conn.execute("UPDATE ps SET region = 'eu' WHERE id = 1")  # moves a row to ps_eu
    b = snapshot(conn)
    with cluster.connect(user="ps_reader") as r:
        now = rows(r, "SELECT id, region FROM ps")
        assert rows(r, "SELECT id, region FROM gsnap_asof(NULL::ps, %s)", b) == now
        assert sum(rows(r, "SELECT id, region FROM gsnap_asof(NULL::ps, %s)", a).values()) == 20
        ranged = rows(r, "SELECT snap_id, (rec).id FROM gsnap_range(NULL::ps, %s, %s)", a, b)
        assert sum(c for (s, _), c in ranged.items() if s == a) == 20
        assert sum(c for (s, _), c in ranged.items() if s == b) == 21
        assert rows(r, "SELECT change, (rec).id FROM gsnap_diff(NULL::ps, %s, %s)", a, b) == \
            Counter([("added", 1)])
        # the secret column is not granted: refused as for the live table
        assert sqlstate(r, "SELECT secret FROM gsnap_asof(NULL::ps, %s)", a) == "42501"
        assert sqlstate(r, "SELECT secret FROM ps") == "42501"
