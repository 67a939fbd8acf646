"""gsnap_versions: every distinct row version of a range of snapshots once, with the run of
snapshots that holds it (issue 9, point 1).

Differential: a random single-session workload (inserts, HOT and non-HOT updates, primary
key changes, growing TOASTed values, deletes and re-inserts of the same keys, VACUUM that
prunes and reuses line pointers) with a snapshot after every step, and some snapshots
deleted afterwards. Every write stamps the row with a new `gen`, so a row's contents name
its version; the truth is then the runs of consecutive readable snapshots in which
gsnap_range returns each contents. gsnap_versions must return exactly those runs, as a
custom scan and as a function scan, over the whole range and over a part of it, with
conditions on `rec` (its Row Filter) and on the run.

Rewrites and column changes: VACUUM FULL gives every row a new place, and snapshots read
with different columns are not compared, so a version's run ends there (documented).
"""

import random

import psycopg
import pytest

from cluster import gsnap_cluster


@pytest.fixture(scope="module")
def cluster():
    yield from gsnap_cluster("versions")


def snapshot(conn) -> int:
    return conn.execute("SELECT gsnap_snapshot()").fetchone()[0]


def runs_of(snaps: list[int], rows) -> list[tuple]:
    """The truth: (first, last, *contents) for each run of consecutive snapshots of `snaps`
    (the readable ones, in order) in which `rows` ((snap_id, *contents) from gsnap_range)
    hold the contents."""
    at = {s: i for i, s in enumerate(snaps)}
    where: dict[tuple, list[int]] = {}
    for snap, *rec in rows:
        where.setdefault(tuple(rec), []).append(at[snap])
    out = []
    for rec, positions in where.items():
        positions.sort()
        start = prev = positions[0]
        for p in positions[1:]:
            if p != prev + 1:
                out.append((snaps[start], snaps[prev], *rec))
                start = p
            prev = p
        out.append((snaps[start], snaps[prev], *rec))
    return sorted(out)


def versions(conn, table: str, a: int, b: int, where: str = "", function_scan: bool = False):
    ordinality = " WITH ORDINALITY" if function_scan else ""
    q = (f"SELECT first_snap, last_snap, (rec).* FROM gsnap_versions(NULL::{table}, {a}, {b})"
         f"{ordinality} {where}")
    return sorted(conn.execute(q).fetchall())


def truth(conn, table: str, snaps: list[int], a: int, b: int, where: str = ""):
    inside = [s for s in snaps if a <= s <= b]
    rows = conn.execute(f"SELECT snap_id, (rec).* FROM gsnap_range(NULL::{table}, {a}, {b}) {where}").fetchall()
    return runs_of(inside, rows)


def plan(conn, q: str) -> str:
    return "\n".join(r[0] for r in conn.execute(f"EXPLAIN {q}").fetchall())


def big_text(rng: random.Random) -> str:
    # incompressible and over the TOAST threshold
    return "".join(f"{rng.getrandbits(64):016x}" for _ in range(200))


def test_versions_equal_the_runs_of_the_range_under_random_changes(cluster):
    rng = random.Random(9)
    with cluster.connect() as conn:
        conn.autocommit = True
        conn.execute("CREATE TABLE tv (id int PRIMARY KEY, gen int NOT NULL, pad text) USING gsnap")
        gen = 0

        def next_gen() -> int:
            nonlocal gen
            gen += 1
            return gen

        live: set[int] = set()
        gone: set[int] = set()
        for i in range(1, 401):
            conn.execute("INSERT INTO tv VALUES (%s, %s, %s)", (i, next_gen(), f"row {i}"))
            live.add(i)
        snaps = [snapshot(conn)]
        next_id = 401
        for step in range(24):
            for _ in range(rng.randint(5, 40)):
                op = rng.random()
                if op < 0.35 and live:  # HOT update: only gen changes
                    i = rng.choice(sorted(live))
                    conn.execute("UPDATE tv SET gen = %s WHERE id = %s", (next_gen(), i))
                elif op < 0.45 and live:  # a value that grows (often moves, sometimes TOASTed)
                    i = rng.choice(sorted(live))
                    pad = big_text(rng) if rng.random() < 0.3 else "grown " * rng.randint(20, 200)
                    conn.execute("UPDATE tv SET gen = %s, pad = %s WHERE id = %s", (next_gen(), pad, i))
                elif op < 0.52 and live:  # the primary key changes
                    i = rng.choice(sorted(live))
                    conn.execute("UPDATE tv SET id = %s, gen = %s WHERE id = %s", (next_id, next_gen(), i))
                    live.discard(i)
                    live.add(next_id)
                    gone.add(i)
                    next_id += 1
                elif op < 0.70 and live:
                    i = rng.choice(sorted(live))
                    conn.execute("DELETE FROM tv WHERE id = %s", (i,))
                    live.discard(i)
                    gone.add(i)
                elif op < 0.85 and gone:  # the same key comes back
                    i = rng.choice(sorted(gone))
                    conn.execute("INSERT INTO tv VALUES (%s, %s, %s)", (i, next_gen(), f"back {i}"))
                    gone.discard(i)
                    live.add(i)
                else:
                    conn.execute("INSERT INTO tv VALUES (%s, %s, %s)", (next_id, next_gen(), "new"))
                    live.add(next_id)
                    next_id += 1
            if step % 6 == 5:
                conn.execute("VACUUM tv")  # prunes; freed line pointers are reused
            snaps.append(snapshot(conn))
        # some snapshots in the middle are deleted: runs go on across them
        dropped = [snaps[5], snaps[11], snaps[12]]
        conn.execute("SELECT gsnap_delete(%s::bigint[])", (dropped,))
        readable = [s for s in snaps if s not in dropped]
        a, b = snaps[0], snaps[-1]

        want = truth(conn, "tv", readable, a, b)
        got = versions(conn, "tv", a, b)
        assert len(got) < len(conn.execute(f"SELECT 1 FROM gsnap_range(NULL::tv, {a}, {b})").fetchall()) / 5
        assert got == want, f"{len(got)} versions, {len(want)} expected"
        assert versions(conn, "tv", a, b, function_scan=True) == want
        assert "Custom Scan (gsnap versions)" in plan(conn, f"SELECT * FROM gsnap_versions(NULL::tv, {a}, {b})")

        # a part of the range, from and to inside it (and on deleted snapshots)
        m1, m2 = snaps[5], snaps[17]
        assert versions(conn, "tv", m1, m2) == truth(conn, "tv", readable, m1, m2)

        # conditions on rec alone are the Row Filter (once per version); on the run, a Filter
        q = f"SELECT * FROM gsnap_versions(NULL::tv, {a}, {b}) WHERE (rec).id % 3 = 0 AND last_snap > {snaps[8]}"
        shown = plan(conn, q)
        assert "Row Filter: (((rec).id % 3) = 0)" in shown and f"Filter: (last_snap > {snaps[8]})" in shown, shown
        got = versions(conn, "tv", a, b, f"WHERE (rec).id % 3 = 0 AND last_snap > {snaps[8]}")
        assert got == [v for v in want if v[2] % 3 == 0 and v[1] > snaps[8]]
        assert got == versions(conn, "tv", a, b, f"WHERE (rec).id % 3 = 0 AND last_snap > {snaps[8]}",
                               function_scan=True)

        # one key's history: every version it had, with when
        history = versions(conn, "tv", a, b, "WHERE (rec).id = 7")
        assert history == [v for v in want if v[2] == 7]


def test_a_rewrite_or_a_column_change_ends_every_run(cluster):
    with cluster.connect() as conn:
        conn.autocommit = True
        conn.execute("CREATE TABLE tr (id int PRIMARY KEY, v text) USING gsnap")
        conn.execute("INSERT INTO tr SELECT g, 'v' || g FROM generate_series(1, 300) g")
        s = [snapshot(conn), snapshot(conn)]
        conn.execute("VACUUM FULL tr")
        s += [snapshot(conn), snapshot(conn)]
        conn.execute("ALTER TABLE tr ADD COLUMN extra int")
        s += [snapshot(conn), snapshot(conn)]
        got = versions(conn, "tr", s[0], s[-1])
        want = sorted((a, b, i, f"v{i}", None) for i in range(1, 301)
                      for a, b in ((s[0], s[1]), (s[2], s[3]), (s[4], s[5])))
        assert got == want
        # within one incarnation and one row type, one row per version
        assert versions(conn, "tr", s[2], s[3]) == sorted((s[2], s[3], i, f"v{i}", None) for i in range(1, 301))


def test_bad_input_gets_the_errors_of_gsnap_range(cluster):
    with cluster.connect() as conn:
        conn.autocommit = True
        conn.execute("CREATE TABLE tb (id int) USING gsnap")
        conn.execute("CREATE TABLE tp (id int) PARTITION BY RANGE (id)")
        s = snapshot(conn)
        cases = {  # the query, and whether it fails
            f"SELECT * FROM gsnap_versions(NULL::tb, {s}, {s - 1})": True,
            f"SELECT * FROM gsnap_versions(NULL::tb, NULL, {s})": True,
            f"SELECT * FROM gsnap_versions(NULL::tb, 0, {s})": True,
            f"SELECT * FROM gsnap_versions(NULL::tb, {s}, {s + 1000})": False,  # up to the newest
            f"SELECT * FROM gsnap_versions(NULL::tp, {s}, {s})": False,  # no partition: no rows
            f"SELECT * FROM gsnap_versions(NULL::int, {s}, {s})": True,
            f"SELECT gsnap_versions(NULL::tb, {s}, NULL)": True,
        }
        for q, fails in cases.items():
            r = q.replace("gsnap_versions", "gsnap_range")
            states = []
            for text in (q, r):
                try:
                    conn.execute(text).fetchall()
                    states.append("ok")
                except psycopg.Error as e:
                    states.append(e.sqlstate)
            assert states[0] == states[1] and (states[0] != "ok") == fails, (q, states)
            assert not states[0].startswith("XX"), (q, states)


# The pattern the README documents for per-snapshot aggregates at the cost of the versions:
# +x at a version's first snapshot, -x after its last, running sums in snapshot order, read
# at every snapshot of the range that holds the table.
PER_SNAPSHOT = """
WITH v AS (SELECT first_snap, last_snap, (rec).gen AS x FROM gsnap_versions(NULL::{t}, {a}, {b})),
ev AS (SELECT first_snap AS at, false AS snap, 1 AS n, x FROM v
       UNION ALL SELECT last_snap + 1, false, -1, -x FROM v
       UNION ALL SELECT snap_id, true, 0, 0 FROM gsnap_snapshots()
                 WHERE state = 'committed' AND snap_id BETWEEN {a} AND {b}),
run AS (SELECT at, snap, sum(n) OVER w AS n, sum(x) OVER w AS total
        FROM ev WINDOW w AS (ORDER BY at, snap))
SELECT at AS snap_id, n, total FROM run WHERE snap AND n > 0 ORDER BY 1"""


def test_per_snapshot_aggregates_from_the_versions_equal_the_range(cluster):
    with cluster.connect() as conn:
        conn.autocommit = True
        conn.execute("CREATE TABLE ta (id int PRIMARY KEY, gen int NOT NULL) USING gsnap")
        conn.execute("INSERT INTO ta SELECT g, g FROM generate_series(1, 2000) g")
        snaps = [snapshot(conn)]
        for i in range(12):
            conn.execute(f"UPDATE ta SET gen = gen + {i + 1} WHERE id % 37 = {i}")
            conn.execute(f"DELETE FROM ta WHERE id % 101 = {i}")
            conn.execute(f"INSERT INTO ta SELECT 10000 * {i + 1} + g, g FROM generate_series(1, {i * 5}) g")
            snaps.append(snapshot(conn))
        conn.execute("SELECT gsnap_delete(ARRAY[%s, %s]::bigint[])", (snaps[4], snaps[9]))
        a, b = snaps[0], snaps[-1]
        naive = conn.execute(f"SELECT snap_id, count(*), sum((rec).gen) FROM gsnap_range(NULL::ta, {a}, {b})"
                             " GROUP BY 1 ORDER BY 1").fetchall()
        got = conn.execute(PER_SNAPSHOT.format(t="ta", a=a, b=b)).fetchall()
        assert got == naive and len(naive) == len(snaps) - 2


AGGREGATE_QUERIES = [
    # (query over {r} = the range, whether the aggregate path computes it)
    ("SELECT snap_id, count(*), sum((rec).v) FROM {r} GROUP BY snap_id", True),
    ("SELECT snap_id, count((rec).v), avg((rec).v), sum((rec).big), avg((rec).big), sum((rec).small),"
     " avg((rec).small) FROM {r} GROUP BY 1", True),
    ("SELECT sum((rec).v) * 2 + count(*) AS x, snap_id FROM {r} WHERE (rec).id % 3 <> 0 GROUP BY snap_id", True),
    ("SELECT snap_id, sum((rec).v + (rec).small) FROM {r} WHERE (rec).v IS NULL OR (rec).v > 5 GROUP BY 1", True),
    ("SELECT snap_id, count(*) FROM {r} WHERE (rec).id < 0 GROUP BY 1", True),  # no rows at all
    # not computed from the versions: PostgreSQL aggregates the range's rows, same results
    ("SELECT snap_id, min((rec).v), max((rec).v) FROM {r} GROUP BY 1", False),
    ("SELECT snap_id, count(*) FROM {r} GROUP BY 1 HAVING count(*) > 10", False),
    ("SELECT snap_id, count(*) FROM {r} WHERE snap_id > 0 GROUP BY 1", False),
    ("SELECT snap_id, count(DISTINCT (rec).v) FROM {r} GROUP BY 1", False),
    ("SELECT snap_id, sum((rec).v) FILTER (WHERE (rec).id > 10) FROM {r} GROUP BY 1", False),
    ("SELECT (rec).v, count(*) FROM {r} GROUP BY 1", False),
]


def test_group_by_snap_id_is_computed_from_the_versions(cluster):
    rng = random.Random(17)
    with cluster.connect() as conn:
        conn.autocommit = True
        conn.execute("CREATE TABLE tg (id int PRIMARY KEY, v int, big bigint, small smallint) USING gsnap")
        conn.execute("INSERT INTO tg SELECT g, g % 50, g * 3000000000000::bigint, (g % 9)::smallint"
                     " FROM generate_series(1, 3000) g")
        snaps = [snapshot(conn)]
        for i in range(14):
            conn.execute(f"UPDATE tg SET v = CASE WHEN random() < 0.2 THEN NULL ELSE v + {rng.randint(-5, 9)} END,"
                         f" big = big + {rng.randint(-10**15, 10**15)} WHERE id % 13 = {i % 13}")
            conn.execute(f"DELETE FROM tg WHERE id % 101 = {i}")
            conn.execute(f"INSERT INTO tg SELECT 100000 * {i + 1} + g, NULL, NULL, 1 FROM generate_series(1, {i}) g")
            if i == 9:
                conn.execute("DELETE FROM tg")  # a snapshot with no rows: no group for it
            if i == 10:
                conn.execute("INSERT INTO tg SELECT g, g % 7, NULL, NULL FROM generate_series(1, 500) g")
            snaps.append(snapshot(conn))
        conn.execute("SELECT gsnap_delete(ARRAY[%s, %s]::bigint[])", (snaps[3], snaps[12]))
        a, b = snaps[0], snaps[-1]
        for q, computed in AGGREGATE_QUERIES:
            ours = q.format(r=f"gsnap_range(NULL::tg, {a}, {b})")
            # WITH ORDINALITY keeps the function scan, which PostgreSQL aggregates itself
            theirs = q.format(r=f"gsnap_range(NULL::tg, {a}, {b}) WITH ORDINALITY")
            shown = plan(conn, ours)
            assert ("gsnap range aggregate" in shown) == computed, (q, shown)
            assert "gsnap range aggregate" not in plan(conn, theirs)
            got = sorted(conn.execute(ours).fetchall(), key=repr)
            want = sorted(conn.execute(theirs).fetchall(), key=repr)
            assert got == want, (q, got[:3], want[:3])
        # a sum beyond bigint is PostgreSQL's error, not a wrong value
        conn.execute("UPDATE tg SET v = 2000000000")
        s = snapshot(conn)
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            conn.execute(f"SELECT snap_id, sum((rec).v::bigint * 4611686018427387) FROM gsnap_range(NULL::tg, {s}, {s})"
                         " GROUP BY 1").fetchall()
