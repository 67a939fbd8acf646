"""Lookups by key AS OF a snapshot (issue 9, point 3): the key map.

Differential: a random workload (inserts, HOT and non-HOT updates, primary key changes,
deletes and re-inserts of the same keys, VACUUM, VACUUM FULL, CLUSTER, TRUNCATE) with a snapshot after
every step. For every snapshot and a sample of keys (present, deleted, never present), the
lookup through the key map (`WHERE id = k`, `IN (...)`, a parameter of a prepared statement)
must return exactly what a filtered full scan of the same snapshot returns (`WHERE id + 0 =
k`, which the key map cannot serve), and EXPLAIN ANALYZE must show that the map was used and
read only a few pages for snapshots taken after the map started.

Also: composite and text keys (collations), NULLs in a unique index, a table without a key
(scans, same rows), a map that starts later than old snapshots (they scan), and gsnap.key_maps
off (the map ends: later snapshots scan, rows equal).
"""

import random
import re
import time

import pytest

from cluster import gsnap_cluster


@pytest.fixture(scope="module")
def cluster():
    yield from gsnap_cluster("keymap", ["gsnap.reclaim_delay = 0"])


def snapshot(conn) -> int:
    return conn.execute("SELECT gsnap_snapshot()").fetchone()[0]


def explain(conn, q: str, params=None) -> str:
    rows = conn.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + q, params)
    return "\n".join(r[0] for r in rows)


def pages_read(plan: str) -> int | None:
    m = re.search(r"Key Map: \d+ candidate blocks, (\d+) pages read", plan)
    return int(m.group(1)) if m else None


def candidates(plan: str) -> int:
    return int(re.search(r"Key Map: (\d+) candidate blocks", plan).group(1))


def test_lookups_by_key_equal_a_filtered_scan_at_every_snapshot(cluster):
    rng = random.Random(20261126)
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, gen int NOT NULL, pad text) USING gsnap")
        conn.execute("INSERT INTO acct SELECT g, 0, repeat('x', 200) FROM generate_series(1, 3000) g")
        live = set(range(1, 3001))
        gen = 0
        snaps = [snapshot(conn)]
        for step in range(14):
            gen += 1
            op = step % 7
            if op == 0:  # HOT updates (pad unchanged size, no index column)
                ids = rng.sample(sorted(live), 40)
                conn.execute("UPDATE acct SET gen = %s WHERE id = ANY(%s)", (gen, ids))
            elif op == 1:  # non-HOT updates: rows grow and move
                ids = rng.sample(sorted(live), 40)
                conn.execute("UPDATE acct SET gen = %s, pad = repeat('y', 600) WHERE id = ANY(%s)",
                             (gen, ids))
            elif op == 2:  # primary keys change
                ids = rng.sample(sorted(live), 20)
                for i in ids:
                    new = i + 100000
                    conn.execute("UPDATE acct SET id = %s, gen = %s WHERE id = %s", (new, gen, i))
                    live.discard(i)
                    live.add(new)
            elif op == 3:  # deletes, and some keys re-inserted
                ids = rng.sample(sorted(live), 60)
                conn.execute("DELETE FROM acct WHERE id = ANY(%s)", (ids,))
                live -= set(ids)
                back = ids[:20]
                conn.execute("INSERT INTO acct SELECT g, %s, 'back' FROM unnest(%s::int[]) g",
                             (gen, back))
                live |= set(back)
            elif op == 4:
                conn.execute("VACUUM acct")
            elif op == 5 and step < 7:
                conn.execute("VACUUM FULL acct")
            elif op == 5:
                conn.execute("CLUSTER acct USING acct_pkey")
            else:
                ids = [max(live) + 1 + i for i in range(30)]
                conn.execute("INSERT INTO acct SELECT g, %s, 'new' FROM unnest(%s::int[]) g",
                             (gen, ids))
                live |= set(ids)
            snaps.append(snapshot(conn))
        # TRUNCATE (a new incarnation, empty at its first snapshot), then some keys come back
        conn.execute("TRUNCATE acct")
        snaps.append(snapshot(conn))
        back = rng.sample(sorted(live), 500)
        gen += 1
        conn.execute("INSERT INTO acct SELECT g, %s, 'after truncate' FROM unnest(%s::int[]) g", (gen, back))
        live = set(back)
        snaps.append(snapshot(conn))
        conn.execute("SELECT gsnap_snapshot(true)")
        ever = sorted(set(r[0] for s in snaps for r in conn.execute(
            "SELECT id FROM gsnap_asof(NULL::acct, %s)", (s,)).fetchall()))
        # A generic plan: the key and the snapshot are parameters bound at execution.
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("PREPARE by_key(bigint, int) AS "
                     "SELECT id, gen, pad FROM gsnap_asof(NULL::acct, $1) WHERE id = $2")
        used = 0
        for s in snaps:
            keys = rng.sample(ever, 12) + [0, -5, 999999]
            for k in keys:
                want = conn.execute(
                    "SELECT id, gen, pad FROM gsnap_asof(NULL::acct, %s) WHERE id + 0 = %s",
                    (s, k)).fetchall()
                got = conn.execute(
                    "SELECT id, gen, pad FROM gsnap_asof(NULL::acct, %s) WHERE id = %s",
                    (s, k)).fetchall()
                assert got == want, (s, k)
                assert conn.execute(f"EXECUTE by_key({s}, {k})").fetchall() == want
            many = keys[:6]
            want = sorted(conn.execute(
                "SELECT id, gen FROM gsnap_asof(NULL::acct, %s) WHERE id + 0 = ANY(%s)",
                (s, many)).fetchall())
            got = sorted(conn.execute(
                "SELECT id, gen FROM gsnap_asof(NULL::acct, %s) WHERE id IN "
                f"({', '.join(str(k) for k in many)})", (s,)).fetchall())
            assert got == want, s
            plan = explain(conn, f"SELECT * FROM gsnap_asof(NULL::acct, {s}) WHERE id = {keys[0]}")
            assert "Key Lookup: id" in plan, plan
            n = pages_read(plan)
            if n is not None:
                used += 1
                assert n <= 3, plan
        # The map starts with the table's first snapshot: every snapshot uses it.
        assert used == len(snaps)
        # What the maps take shows in the store's statistics (at least an entry per key).
        entries, nbytes = conn.execute(
            "SELECT key_map_entries, key_map_bytes FROM gsnap_store_stats()").fetchone()
        assert entries >= len(live) and nbytes > 0, (entries, nbytes)
        # Ranges and versions (across the VACUUM FULL: two incarnations, two maps): the
        # lookup equals the filtered full read.
        for a, b in [(snaps[0], snaps[-1]), (snaps[3], snaps[9]), (snaps[-2], snaps[-1])]:
            for k in rng.sample(ever, 6) + [0]:
                for q in ["SELECT snap_id, (rec).* FROM gsnap_range(NULL::acct, {a}, {b}) WHERE (rec).id {c}",
                          "SELECT first_snap, last_snap, (rec).* FROM gsnap_versions(NULL::acct, {a}, {b}) "
                          "WHERE (rec).id {c}"]:
                    want = sorted(conn.execute(q.format(a=a, b=b, c=f"+ 0 = {k}")).fetchall())
                    got = sorted(conn.execute(q.format(a=a, b=b, c=f"= {k}")).fetchall())
                    assert got == want, (a, b, k, q)
                    got = sorted(conn.execute(q.format(a=a, b=b, c=f"IN ({k}, -1)")).fetchall())
                    assert got == want, (a, b, k, q)
            plan = explain(conn, f"SELECT * FROM gsnap_versions(NULL::acct, {a}, {b}) WHERE (rec).id = {ever[0]}")
            assert "Key Lookup: id" in plan and re.search(r"Key Map: .* page images read", plan), plan
            images = int(re.search(r"Key Map: .*, (\d+) page images read", plan).group(1))
            assert images <= 3 * (snaps.index(b) - snaps.index(a) + 1), plan
        # A condition that does not fix the key is not a lookup.
        plan = explain(conn, f"SELECT * FROM gsnap_asof(NULL::acct, {snaps[-1]}) WHERE id > 5")
        assert "Key Lookup" not in plan


def test_composite_text_and_nullable_keys(cluster):
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE comp (a int, b text COLLATE \"C\", v int, PRIMARY KEY (a, b)) USING gsnap")
        conn.execute("INSERT INTO comp SELECT g % 50, 'k' || g, g FROM generate_series(1, 2000) g")
        conn.execute("CREATE TABLE uq (u varchar(20), v int) USING gsnap")
        conn.execute("CREATE UNIQUE INDEX ON uq (u)")
        conn.execute("INSERT INTO uq SELECT CASE WHEN g % 10 = 0 THEN NULL ELSE 'u' || g END, g "
                     "FROM generate_series(1, 2000) g")
        s1 = snapshot(conn)
        conn.execute("UPDATE comp SET b = b || 'x', v = -v WHERE a = 7")
        conn.execute("UPDATE uq SET u = u || 'z' WHERE v % 7 = 0")
        s2 = conn.execute("SELECT gsnap_snapshot(true)").fetchone()[0]
        for s in (s1, s2):
            for a, b in [(7, 'k7'), (7, 'k7x'), (8, 'k8'), (3, 'nope')]:
                want = conn.execute("SELECT * FROM gsnap_asof(NULL::comp, %s) "
                                    "WHERE a + 0 = %s AND b || '' = %s", (s, a, b)).fetchall()
                got = conn.execute("SELECT * FROM gsnap_asof(NULL::comp, %s) WHERE a = %s AND b = %s",
                                   (s, a, b)).fetchall()
                assert got == want, (s, a, b)
            plan = explain(conn, f"SELECT * FROM gsnap_asof(NULL::comp, {s}) WHERE a = 7 AND b = 'k7'")
            assert "Key Lookup: a, b" in plan and pages_read(plan) is not None, plan
            # Only a part of the key: a scan.
            assert "Key Lookup" not in explain(
                conn, f"SELECT * FROM gsnap_asof(NULL::comp, {s}) WHERE a = 7")
            # Another collation than the key's: a nondeterministic one cannot use the map,
            # a deterministic one can; the rows are right either way.
            for u in ['u7', 'u14z', 'u14', 'nope']:
                want = conn.execute("SELECT * FROM gsnap_asof(NULL::uq, %s) WHERE u || '' = %s",
                                    (s, u)).fetchall()
                for q in ["u = %s", "u = %s::varchar", "u = ANY(ARRAY[%s, NULL])",
                          "u = %s COLLATE \"C\""]:
                    got = conn.execute(f"SELECT * FROM gsnap_asof(NULL::uq, %s) WHERE {q}",
                                       (s, u)).fetchall()
                    assert got == want, (s, u, q)
            plan = explain(conn, f"SELECT * FROM gsnap_asof(NULL::uq, {s}) WHERE u = 'u7'")
            assert "Key Lookup: u" in plan and pages_read(plan) is not None, plan
            # NULL never equals: nothing, through the map.
            assert conn.execute(f"SELECT * FROM gsnap_asof(NULL::uq, {s}) WHERE u = NULL").fetchall() == []


def partitioned_read(plan: str) -> tuple[int, int, int] | None:
    """Of a lookup in a partitioned table whose partitions' maps all served it: candidate
    blocks, partitions, pages (or page images) read."""
    m = re.search(r"Key Map: (\d+) candidate blocks in (\d+) partitions, (\d+) (?:pages|page images) read",
                  plan)
    return tuple(int(g) for g in m.groups()) if m else None


def whole_partitions(plan: str) -> int | None:
    """Of a lookup in a partitioned table none of whose partitions' maps served it: how many
    partitions were read whole."""
    m = re.search(r"Key Map: none covers it in the (\d+) partitions: every page read", plan)
    return int(m.group(1)) if m else None


def test_lookups_by_key_in_a_partitioned_table(cluster):
    """A partitioned table's key (its primary key, which every partition's is a partition
    of) is looked up in each partition's key map, recorded in the partition's own attribute
    numbers: a partition made with another column order and attached, one detached and
    dropped since and the one made in its place, are looked up too. Snapshots taken before the table had its key read every
    page of every partition. The rows always equal a filtered scan of the same snapshot."""
    rng = random.Random(20261207)
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE orders (id int NOT NULL, gen int NOT NULL, pad text) "
                     "PARTITION BY HASH (id)")
        for r in range(3):
            conn.execute(f"CREATE TABLE orders_{r} PARTITION OF orders "
                         f"FOR VALUES WITH (MODULUS 4, REMAINDER {r}) USING gsnap")
        # Another layout: columns in another order, and a dropped one.
        conn.execute("CREATE TABLE orders_3 (pad text, junk int, gen int NOT NULL, id int NOT NULL) USING gsnap")
        conn.execute("ALTER TABLE orders_3 DROP COLUMN junk")
        conn.execute("ALTER TABLE orders ATTACH PARTITION orders_3 FOR VALUES WITH (MODULUS 4, REMAINDER 3)")
        conn.execute("INSERT INTO orders SELECT g, 0, repeat('x', 200) FROM generate_series(1, 6000) g")
        before_key = snapshot(conn)
        conn.execute("ALTER TABLE orders ADD PRIMARY KEY (id)")
        live = set(range(1, 6001))
        snaps = []
        for step in range(8):
            gen = step + 1
            op = step % 4
            ids = rng.sample(sorted(live), 60)
            if op == 0:  # non-HOT updates: rows grow and move
                conn.execute("UPDATE orders SET gen = %s, pad = repeat('y', 500) WHERE id = ANY(%s)", (gen, ids))
            elif op == 1:  # keys change (and rows move between partitions)
                for i in ids[:20]:
                    conn.execute("UPDATE orders SET id = %s, gen = %s WHERE id = %s", (i + 100000, gen, i))
                    live.discard(i)
                    live.add(i + 100000)
            elif op == 2:  # deletes, some keys back
                conn.execute("DELETE FROM orders WHERE id = ANY(%s)", (ids,))
                live -= set(ids)
                conn.execute("INSERT INTO orders SELECT g, %s, 'back' FROM unnest(%s::int[]) g", (gen, ids[:20]))
                live |= set(ids[:20])
            else:
                conn.execute("UPDATE orders SET gen = %s WHERE id = ANY(%s)", (gen, ids))
            snaps.append(snapshot(conn))
            if step == 4:  # a partition goes: detached and dropped (its snapshots keep it)
                conn.execute("ALTER TABLE orders DETACH PARTITION orders_1")
                conn.execute("DROP TABLE orders_1")
                conn.execute("CREATE TABLE orders_1b PARTITION OF orders "
                             "FOR VALUES WITH (MODULUS 4, REMAINDER 1) USING gsnap")
                live = {r[0] for r in conn.execute("SELECT id FROM orders").fetchall()}
        snaps.append(conn.execute("SELECT gsnap_snapshot(true)").fetchone()[0])
        ever = sorted(set(r[0] for s in [before_key] + snaps for r in conn.execute(
            "SELECT id FROM gsnap_asof(NULL::orders, %s)", (s,)).fetchall()))
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("PREPARE part_key(bigint, int) AS "
                     "SELECT id, gen, pad FROM gsnap_asof(NULL::orders, $1) WHERE id = $2")
        for s in [before_key] + snaps:
            for k in rng.sample(ever, 10) + [0, 999999]:
                want = conn.execute("SELECT id, gen, pad FROM gsnap_asof(NULL::orders, %s) "
                                    "WHERE id + 0 = %s", (s, k)).fetchall()
                got = conn.execute("SELECT id, gen, pad FROM gsnap_asof(NULL::orders, %s) "
                                   "WHERE id = %s", (s, k)).fetchall()
                assert got == want, (s, k)
                assert conn.execute(f"EXECUTE part_key({s}, {k})").fetchall() == want, (s, k)
            many = rng.sample(ever, 5)
            want = sorted(conn.execute("SELECT id, gen FROM gsnap_asof(NULL::orders, %s) "
                                       "WHERE id + 0 = ANY(%s)", (s, many)).fetchall())
            got = sorted(conn.execute("SELECT id, gen FROM gsnap_asof(NULL::orders, %s) "
                                      "WHERE id = ANY(%s)", (s, many)).fetchall())
            assert got == want, s
            plan = explain(conn, f"SELECT * FROM gsnap_asof(NULL::orders, {s}) WHERE id = {ever[len(ever) // 2]}")
            assert "Key Lookup: id" in plan, plan
            partitions = int(re.search(r"Partitions Read: (\d+) of", plan).group(1))
            assert partitions == 4, plan
            if s == before_key:
                # No partition had a map then: every page of each is read.
                assert whole_partitions(plan) == 4, plan
            else:
                # Each partition's map names a page or two (collisions aside), the dropped
                # partition's and the reordered one's included.
                _, mapped, read = partitioned_read(plan)
                assert mapped == 4 and read <= 2 * 4, plan
        # Ranges and versions over the partitions (the dropped one and its successor for
        # part of the range each).
        for a, b in [(snaps[0], snaps[-1]), (before_key, snaps[2])]:
            for k in rng.sample(ever, 5) + [0]:
                for q in ["SELECT snap_id, (rec).* FROM gsnap_range(NULL::orders, {a}, {b}) WHERE (rec).id {c}",
                          "SELECT first_snap, last_snap, (rec).* FROM gsnap_versions(NULL::orders, {a}, {b}) "
                          "WHERE (rec).id {c}"]:
                    want = sorted(conn.execute(q.format(a=a, b=b, c=f"+ 0 = {k}")).fetchall())
                    got = sorted(conn.execute(q.format(a=a, b=b, c=f"= {k}")).fetchall())
                    assert got == want, (a, b, k, q)
            for reader in ["gsnap_range", "gsnap_versions"]:
                plan = explain(conn, f"SELECT * FROM {reader}(NULL::orders, {a}, {b}) WHERE (rec).id = {ever[0]}")
                assert "Key Lookup: id" in plan, plan
                partitions = int(re.search(r"Partitions Read: (\d+) of", plan).group(1))
                if a == before_key:
                    # The map of each starts after the range's first snapshot.
                    assert partitions == 4 and whole_partitions(plan) == 4, plan
                else:
                    # orders_1 for part of the range, orders_1b for the rest.
                    n = snaps.index(b) - snaps.index(a) + 1
                    _, mapped, images = partitioned_read(plan)
                    assert mapped == partitions == 5 and images <= 2 * 4 * n, plan


def test_a_map_started_later_and_key_maps_off(cluster):
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE nokey (id int, v int) USING gsnap")
        conn.execute("INSERT INTO nokey SELECT g, g FROM generate_series(1, 500) g")
        s1 = snapshot(conn)
        # No key: every lookup scans, and is right.
        assert conn.execute("SELECT v FROM gsnap_asof(NULL::nokey, %s) WHERE id = 42", (s1,)).fetchall() == [(42,)]
        assert "Key Lookup" not in explain(conn, f"SELECT * FROM gsnap_asof(NULL::nokey, {s1}) WHERE id = 42")
        # A primary key added: the next capture starts the map (reading every page).
        conn.execute("ALTER TABLE nokey ADD PRIMARY KEY (id)")
        conn.execute("UPDATE nokey SET v = -v WHERE id = 42")
        s2 = conn.execute("SELECT gsnap_snapshot(true)").fetchone()[0]
        plan = explain(conn, f"SELECT * FROM gsnap_asof(NULL::nokey, {s1}) WHERE id = 42")
        assert "Key Map: starts at snapshot" in plan or "Key Map: none" in plan, plan
        plan = explain(conn, f"SELECT * FROM gsnap_asof(NULL::nokey, {s2}) WHERE id = 42")
        assert pages_read(plan) == 1, plan
        assert conn.execute("SELECT v FROM gsnap_asof(NULL::nokey, %s) WHERE id = 42", (s1,)).fetchall() == [(42,)]
        assert conn.execute("SELECT v FROM gsnap_asof(NULL::nokey, %s) WHERE id = 42", (s2,)).fetchall() == [(-42,)]
        # Key maps off: the map ends at the next snapshot; lookups scan and stay right.
        conn.execute("ALTER SYSTEM SET gsnap.key_maps = off")
        conn.execute("SELECT pg_reload_conf()")
        cluster.wait_for_setting("gsnap.key_maps", "off") if hasattr(cluster, "wait_for_setting") else __import__("time").sleep(1.5)
        conn.execute("UPDATE nokey SET v = 0 WHERE id = 42")
        s3 = conn.execute("SELECT gsnap_snapshot(true)").fetchone()[0]
        plan = explain(conn, f"SELECT * FROM gsnap_asof(NULL::nokey, {s3}) WHERE id = 42")
        assert "Key Map: none" in plan, plan
        assert conn.execute("SELECT v FROM gsnap_asof(NULL::nokey, %s) WHERE id = 42", (s3,)).fetchall() == [(0,)]
        conn.execute("ALTER SYSTEM RESET gsnap.key_maps")
        conn.execute("SELECT pg_reload_conf()")


def test_entries_only_deleted_snapshots_needed_are_swept(cluster):
    """A key that moved through blocks at snapshots deleted since: once they are reclaimed,
    the sweep removes the entries only they needed (fewer candidate blocks for a range over
    them), and the lookups at the snapshots left are still exact."""
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE mv (id int PRIMARY KEY, pad text) USING gsnap WITH (fillfactor = 100)")
        conn.execute("INSERT INTO mv SELECT g, repeat('a', 100) FROM generate_series(1, 2000) g")
        snaps = [snapshot(conn)]
        for i in range(4):
            # Each time the row grows and no longer fits its page: it moves to the end, past
            # the rows added meanwhile (a new block each time).
            conn.execute("INSERT INTO mv SELECT g, repeat('c', 100) FROM generate_series(%s::int, %s::int) g",
                         (10000 + 200 * i, 10199 + 200 * i))
            conn.execute("UPDATE mv SET pad = repeat('b', 300 + %s) WHERE id = 7", (i,))
            snaps.append(snapshot(conn))
        q = (f"SELECT first_snap, last_snap, (rec).id, length((rec).pad) "
             f"FROM gsnap_versions(NULL::mv, {snaps[0]}, {snaps[-1]}) WHERE (rec).id {{}} ORDER BY 1")
        before = candidates(explain(conn, q.format("= 7")))
        assert before >= 4, before
        doomed = snaps[1:4]
        conn.execute("SELECT gsnap_delete(%s::bigint[])", (doomed,))
        deadline = time.time() + 60
        while time.time() < deadline:
            st = dict(conn.execute("SELECT snap_id, state FROM gsnap_snapshots()").fetchall())
            if all(st.get(s) == "reclaimed" for s in doomed) and candidates(explain(conn, q.format("= 7"))) < before:
                break
            time.sleep(0.2)
        after = candidates(explain(conn, q.format("= 7")))
        assert after < before, (before, after)
        assert conn.execute(q.format("= 7")).fetchall() == conn.execute(q.format("+ 0 = 7")).fetchall()
        for s in (snaps[0], snaps[-1]):
            for k in (7, 8, 1999):
                want = conn.execute("SELECT * FROM gsnap_asof(NULL::mv, %s) WHERE id + 0 = %s", (s, k)).fetchall()
                assert conn.execute("SELECT * FROM gsnap_asof(NULL::mv, %s) WHERE id = %s", (s, k)).fetchall() == want


def test_ranges_of_integer_keys(cluster):
    """`id BETWEEN a AND b` (and `>`, `>=`, `<`, `<=` pairs, either side, int2/int4/int8
    bounds) on an integer key is a lookup of the keys between the bounds, when there are at
    most 8,192 of them (at execution: a parameter's range wider than that reads every page;
    constants that far apart plan no lookup). The rows always equal a filtered scan of the
    same snapshot: empty ranges, NULL bounds, bounds past the type's limits, composite keys
    with an equality on the other column, ranges and versions, a partitioned table, and a
    session under gsnap.as_of."""
    rng = random.Random(20261207)
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE ledger (id bigint PRIMARY KEY, gen int NOT NULL, pad text) USING gsnap")
        conn.execute("INSERT INTO ledger SELECT g, 0, repeat('x', 300) FROM generate_series(1, 20000) g")
        conn.execute("INSERT INTO ledger VALUES (9223372036854775807, 0, 'max'), "
                     "(-9223372036854775808, 0, 'min')")
        conn.execute("CREATE TABLE small (id smallint PRIMARY KEY, v int) USING gsnap")
        conn.execute("INSERT INTO small SELECT g, g FROM generate_series(-32768, 32767, 7) g")
        conn.execute("INSERT INTO small VALUES (32767, 0) ON CONFLICT DO NOTHING")
        conn.execute("CREATE TABLE lines (region int, n int, v int, PRIMARY KEY (region, n)) USING gsnap")
        conn.execute("INSERT INTO lines SELECT g % 8, g, g FROM generate_series(1, 8000) g")
        snaps = [snapshot(conn)]
        for gen in range(1, 4):
            ids = rng.sample(range(1, 20001), 300)
            conn.execute("UPDATE ledger SET gen = %s, pad = repeat('y', 400) WHERE id = ANY(%s)", (gen, ids[:200]))
            conn.execute("DELETE FROM ledger WHERE id = ANY(%s)", (ids[200:],))
            conn.execute("INSERT INTO ledger SELECT g, %s, 'new' FROM unnest(%s::bigint[]) g "
                         "ON CONFLICT DO NOTHING", (gen, ids[250:]))
            conn.execute("UPDATE small SET v = -v WHERE id %% 3 = %s", (gen % 3,))
            conn.execute("UPDATE lines SET v = -v, n = n + 100000 WHERE n %% 97 = %s", (gen,))
            snaps.append(snapshot(conn))
        snaps.append(conn.execute("SELECT gsnap_snapshot(true)").fetchone()[0])
        total = conn.execute("SELECT pg_relation_size('ledger') / 8192").fetchone()[0]
        assert total > 500

        def same(s, table, cond, filtered, cols="*"):
            got = sorted(conn.execute(f"SELECT {cols} FROM gsnap_asof(NULL::{table}, {s}) WHERE {cond}").fetchall())
            want = sorted(conn.execute(f"SELECT {cols} FROM gsnap_asof(NULL::{table}, {s}) WHERE {filtered}").fetchall())
            assert got == want, (s, table, cond)
            return got

        for s in snaps:
            for _ in range(6):
                lo = rng.randrange(-5, 20010)
                hi = lo + rng.randrange(0, 400)
                for cond in [f"id BETWEEN {lo} AND {hi}", f"id >= {lo} AND id < {hi}",
                             f"{lo} < id AND {hi} >= id", f"id > {lo}::int AND id <= {hi}::smallint % 32000",
                             f"id BETWEEN {hi} AND {lo}", f"id BETWEEN {lo} AND {hi} AND id <> {lo + 1}"]:
                    filtered = cond.replace("id", "(id + 0)")
                    same(s, "ledger", cond, filtered, "id, gen, pad")
            for cond in ["id BETWEEN NULL AND 5", "id > 9223372036854775000",
                         "id > 9223372036854775000 AND id <= 9223372036854775807",
                         "id >= -9223372036854775808 AND id < -9223372036854775000",
                         "id BETWEEN 9223372036854775807 AND 9223372036854775807"]:
                same(s, "ledger", cond, cond.replace("id", "(id + 0)"))
            for cond in ["id BETWEEN 32700 AND 40000", "id BETWEEN -40000 AND -32700",
                         "id > 32766 AND id < 99999", "id BETWEEN 100 AND 300"]:
                same(s, "small", cond, cond.replace("id", "(id + 0)"))
            for cond in ["region = 3 AND n BETWEEN 100 AND 300", "region IN (1, 2) AND n BETWEEN 50 AND 250",
                         "region BETWEEN 1 AND 3 AND n >= 1000 AND n < 1100",
                         "region = 5 AND n BETWEEN 100090 AND 100500"]:
                same(s, "lines", cond, re.sub(r"\b(region|n)\b", r"(\1 + 0)", cond))
            plan = explain(conn, f"SELECT * FROM gsnap_asof(NULL::ledger, {s}) WHERE id BETWEEN 5000 AND 5100")
            assert "Key Lookup: id (range)" in plan, plan
            assert pages_read(plan) <= 40, plan
            plan = explain(conn, f"SELECT * FROM gsnap_asof(NULL::lines, {s}) "
                                 "WHERE region = 3 AND n BETWEEN 100 AND 300")
            assert "Key Lookup: region, n (range)" in plan and pages_read(plan) <= 10, plan
        # Bounds of a domain over an integer type.
        conn.execute("CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
        got = same(snaps[-1], "ledger", "id BETWEEN 3000::posint AND 3010::posint",
                   "id + 0 BETWEEN 3000 AND 3010", "id")
        assert len(got) >= 5
        assert "Key Lookup: id (range)" in explain(
            conn, f"SELECT * FROM gsnap_asof(NULL::ledger, {snaps[-1]}) WHERE id BETWEEN 3000::posint AND 3010::posint")
        # Constants more than 8,192 keys apart (with the other columns' values), or a single
        # bound: no lookup.
        for cond in ["id BETWEEN 1 AND 8193", "id > 5", "region BETWEEN 1 AND 3 AND n BETWEEN 1 AND 3000"]:
            table = "lines" if "region" in cond else "ledger"
            assert "Key Lookup" not in explain(conn, f"SELECT * FROM gsnap_asof(NULL::{table}, {s}) WHERE {cond}")
        assert "Key Lookup: id (range)" in explain(
            conn, f"SELECT * FROM gsnap_asof(NULL::ledger, {s}) WHERE id BETWEEN 1 AND 8192")
        # Parameters: the width is known at execution; too wide reads every page, rows right.
        # (More than 512 keys are asked of the worker in several requests.)
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("PREPARE span(bigint, bigint, bigint) AS "
                     "SELECT id, gen FROM gsnap_asof(NULL::ledger, $1) WHERE id BETWEEN $2 AND $3")
        for lo, hi in [(100, 150), (100, 5000), (100, 15000), (7, 6), (None, 5)]:
            want = sorted(conn.execute("SELECT id, gen FROM gsnap_asof(NULL::ledger, %s) "
                                       "WHERE id + 0 BETWEEN %s AND %s", (snaps[1], lo, hi)).fetchall())
            args = ", ".join("NULL" if v is None else str(v) for v in (snaps[1], lo, hi))
            got = sorted(conn.execute(f"EXECUTE span({args})").fetchall())
            assert got == want, (lo, hi)
        plan = explain(conn, f"EXECUTE span({snaps[1]}, 100, 15000)")
        assert "Key Lookup: id (range)" in plan and "too many keys" in plan, plan
        plan = explain(conn, f"EXECUTE span({snaps[1]}, 100, 150)")
        assert pages_read(plan) <= 20, plan
        conn.execute("RESET plan_cache_mode")
        # More than 512 keys (asked of the worker in several requests) only in a table of at
        # least three blocks per key: one row per page here.
        conn.execute("CREATE TABLE wide (id int PRIMARY KEY, pad text) USING gsnap WITH (fillfactor = 10)")
        conn.execute("INSERT INTO wide SELECT g, repeat('w', 400) FROM generate_series(1, 3000) g")
        conn.execute("UPDATE wide SET pad = 'short' WHERE id % 10 = 0")
        w = snapshot(conn)
        blocks = conn.execute("SELECT pg_relation_size('wide') / 8192").fetchone()[0]
        assert blocks >= 3000, blocks
        for lo, hi, looked_up in [(101, 1000, True), (1, 1100, False)]:
            cond = f"id BETWEEN {lo} AND {hi}"
            got = same(w, "wide", cond, cond.replace("id", "(id + 0)"), "id, pad")
            assert len(got) == hi - lo + 1
            plan = explain(conn, f"SELECT * FROM gsnap_asof(NULL::wide, {w}) WHERE {cond}")
            assert "Key Lookup: id (range)" in plan, plan
            if looked_up:
                assert hi - lo + 1 <= pages_read(plan) <= hi - lo + 11, plan
            else:
                assert "too many keys or pages" in plan, plan
        # Ranges and versions: `(rec).id BETWEEN`.
        a, b = snaps[0], snaps[-1]
        for q in ["SELECT snap_id, (rec).* FROM gsnap_range(NULL::ledger, {a}, {b}) WHERE {c}",
                  "SELECT first_snap, last_snap, (rec).* FROM gsnap_versions(NULL::ledger, {a}, {b}) WHERE {c}"]:
            for lo in rng.sample(range(1, 20000), 4):
                c = f"(rec).id BETWEEN {lo} AND {lo + 200}"
                want = sorted(conn.execute(q.format(a=a, b=b, c=c.replace("(rec).id", "((rec).id + 0)"))).fetchall())
                got = sorted(conn.execute(q.format(a=a, b=b, c=c)).fetchall())
                assert got == want, (q, c)
            plan = explain(conn, q.format(a=a, b=b, c="(rec).id BETWEEN 300 AND 400"))
            assert "Key Lookup: id (range)" in plan and re.search(r"Key Map: .* page images read", plan), plan
        # A session as of a snapshot reads the table by its key range too.
        conn.execute(f"SET gsnap.as_of = '{snaps[2]}'")
        got = sorted(conn.execute("SELECT id, gen FROM ledger WHERE id BETWEEN 700 AND 900").fetchall())
        plan = explain(conn, "SELECT id, gen FROM ledger WHERE id BETWEEN 700 AND 900")
        conn.execute("RESET gsnap.as_of")
        assert got == sorted(conn.execute(f"SELECT id, gen FROM gsnap_asof(NULL::ledger, {snaps[2]}) "
                                          "WHERE id + 0 BETWEEN 700 AND 900").fetchall())
        assert "Key Lookup: id (range)" in plan and pages_read(plan) <= 30, plan
        # A partitioned table: each partition's map.
        conn.execute("CREATE TABLE parts (id int PRIMARY KEY, v int) PARTITION BY HASH (id)")
        for r in range(3):
            conn.execute(f"CREATE TABLE parts_{r} PARTITION OF parts "
                         f"FOR VALUES WITH (MODULUS 3, REMAINDER {r}) USING gsnap")
        conn.execute("INSERT INTO parts SELECT g, g FROM generate_series(1, 9000) g")
        s = snapshot(conn)
        conn.execute("UPDATE parts SET v = -v WHERE id BETWEEN 2000 AND 2100")
        s2 = conn.execute("SELECT gsnap_snapshot(true)").fetchone()[0]
        for snap in (s, s2):
            got = same(snap, "parts", "id BETWEEN 2050 AND 2150", "id + 0 BETWEEN 2050 AND 2150")
            assert len(got) == 101
            plan = explain(conn, f"SELECT * FROM gsnap_asof(NULL::parts, {snap}) WHERE id BETWEEN 2050 AND 2150")
            assert "Key Lookup: id (range)" in plan, plan
            _, mapped, read = partitioned_read(plan)
            assert mapped == 3 and read <= 12, plan
