"""Diffs read from the capture's page deltas (issue 9, point 4).

With every changed page's new image the capture keeps its delta from the page's previous
image: the tuples removed and added (`gsnap_format::delta`). A diff of two snapshots reads
the delta of a changed block when its image at the first snapshot is the delta's base, and
both images otherwise.

Differential: a random workload (HOT and non-HOT updates, deletes, inserts, TOASTed values,
VACUUM, a dropped column, VACUUM FULL, a page changed back to an earlier content) with a
snapshot after every step. For every pair of adjacent snapshots and a sample of distant ones,
`gsnap_diff` must return exactly the multiset difference of the two AS OF scans (the rows of
a that b lacks as removed, the rows of b that a lacks as added), and EXPLAIN ANALYZE must say
that the adjacent diffs read their changed pages from deltas. The same after deleting
snapshots in between (a delta's base is then no longer the image at a: images are read), and
with `gsnap.page_deltas` off (no deltas: the images are read, the rows are the same).
"""

import random
import re
import time

import psycopg
import pytest

from cluster import gsnap_cluster


@pytest.fixture(scope="module")
def cluster():
    yield from gsnap_cluster("deltas", ["gsnap.reclaim_delay = 0"])


def snapshot(conn) -> int:
    return conn.execute("SELECT gsnap_snapshot()").fetchone()[0]


def set_deltas(conn, on: bool):
    """Sets gsnap.page_deltas and gives the worker time to reload it."""
    conn.execute("ALTER SYSTEM " + ("RESET gsnap.page_deltas" if on
                                    else "SET gsnap.page_deltas = off"))
    conn.execute("SELECT pg_reload_conf()")
    want = "on" if on else "off"
    deadline = time.time() + 10
    while conn.execute("SELECT current_setting('gsnap.page_deltas')").fetchone()[0] != want:
        assert time.time() < deadline
        time.sleep(0.05)
    time.sleep(1)  # the worker reloads on its own signal


def wait_reclaimed(conn, snaps):
    deadline = time.time() + 60
    while True:
        st = dict(conn.execute("SELECT snap_id, state FROM gsnap_snapshots()").fetchall())
        if all(st.get(s) == "reclaimed" for s in snaps):
            return
        assert time.time() < deadline, st
        time.sleep(0.1)


def truth(conn, table: str, a: int, b: int) -> list:
    """The multiset difference of the AS OF scans at a and b, as (change, rec text)."""
    q = f"""
        (SELECT 'removed', t::text FROM gsnap_asof(NULL::{table}, {a}) t
         EXCEPT ALL SELECT 'removed', t::text FROM gsnap_asof(NULL::{table}, {b}) t)
        UNION ALL
        (SELECT 'added', t::text FROM gsnap_asof(NULL::{table}, {b}) t
         EXCEPT ALL SELECT 'added', t::text FROM gsnap_asof(NULL::{table}, {a}) t)"""
    return sorted(conn.execute(q).fetchall())


def diff(conn, table: str, a: int, b: int) -> list:
    q = f"SELECT change, rec::text FROM gsnap_diff(NULL::{table}, {a}, {b})"
    return sorted(conn.execute(q).fetchall())


def by_key(conn, table: str, a: int, b: int) -> list:
    q = (f"SELECT change, coalesce((old).id, (new).id), old::text, new::text "
         f"FROM gsnap_diff_by_key(NULL::{table}, {a}, {b})")
    return sorted(conn.execute(q).fetchall(), key=repr)


def by_key_truth(conn, table: str, a: int, b: int) -> list:
    """The AS OF scans at a and b matched by id: updated (other contents), removed, added."""
    q = f"""
        SELECT CASE WHEN o.id IS NULL THEN 'added' WHEN n.id IS NULL THEN 'removed'
               ELSE 'updated' END, coalesce(o.id, n.id),
               CASE WHEN o.id IS NOT NULL THEN o::text END, CASE WHEN n.id IS NOT NULL THEN n::text END
        FROM gsnap_asof(NULL::{table}, {a}) o FULL JOIN gsnap_asof(NULL::{table}, {b}) n USING (id)
        WHERE o.id IS NULL OR n.id IS NULL OR o::text <> n::text"""
    return sorted(conn.execute(q).fetchall(), key=repr)


def placed(conn, table: str) -> set:
    """Where each live row of `table` is: (ctid, id)."""
    return set(conn.execute(f"SELECT ctid::text, id FROM {table}").fetchall())


def reads(conn, table: str, a: int, b: int) -> tuple[int, int]:
    """EXPLAIN ANALYZE's changed pages of the diff, and how many were read from deltas."""
    plan = "\n".join(r[0] for r in conn.execute(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "
        f"SELECT * FROM gsnap_diff(NULL::{table}, {a}, {b})"))
    m = re.search(r"Changed Pages: (\d+): (\d+) from deltas, (\d+) from images", plan)
    assert m, plan
    assert int(m.group(1)) == int(m.group(2)) + int(m.group(3))
    return int(m.group(1)), int(m.group(2))


def workload_step(conn, rng: random.Random, step: int, gen: int) -> str:
    """One step of the workload on table `dt`; returns what it did."""
    op = step % 8
    if op == 0:  # HOT updates of a few rows at random
        conn.execute("UPDATE dt SET gen = %s WHERE id IN (SELECT id FROM dt ORDER BY random() "
                     "LIMIT 25)", (gen,))
    elif op == 1:  # non-HOT updates: rows grow and move to other pages
        conn.execute("UPDATE dt SET gen = %s, pad = repeat('y', 700) WHERE id IN "
                     "(SELECT id FROM dt ORDER BY random() LIMIT 15)", (gen,))
    elif op == 2:  # deletes and inserts
        conn.execute("DELETE FROM dt WHERE id IN (SELECT id FROM dt ORDER BY random() LIMIT 30)")
        conn.execute("INSERT INTO dt (id, gen, pad) SELECT 100000 + %s * 100 + g, %s, 'new' "
                     "FROM generate_series(1, 20) g", (gen, gen))
    elif op == 3:  # a TOASTed value changes (stored out of line, not compressible)
        conn.execute("UPDATE dt SET big = (SELECT string_agg(md5(g::text || %s), '') "
                     "FROM generate_series(1, 200) g) WHERE id IN "
                     "(SELECT id FROM dt ORDER BY random() LIMIT 3)", (str(gen),))
    elif op == 4:  # VACUUM prunes the dead tuples: pages change without a row changing
        conn.execute("VACUUM dt")
    elif op == 5:  # an update undone: the pages go back to an earlier content
        conn.execute("UPDATE dt SET gen = gen + 1000 WHERE id BETWEEN 1 AND 5")
        conn.execute("UPDATE dt SET gen = gen - 1000 WHERE id BETWEEN 1 AND 5")
    elif op == 6:  # many rows of a few pages
        conn.execute("UPDATE dt SET gen = %s WHERE id BETWEEN %s AND %s",
                     (gen, 40 * step, 40 * step + 120))
    else:  # one row
        conn.execute("UPDATE dt SET gen = %s WHERE id = (SELECT min(id) FROM dt)", (gen,))
    return ["hot", "move", "delete/insert", "toast", "vacuum", "undo", "bulk", "one"][op]


def test_diffs_equal_the_difference_of_the_snapshots(cluster):
    rng = random.Random(20261127)
    with cluster.connect() as conn:
        # (fillfactor 80: small updates stay on their page, so no page is new at b)
        conn.execute("CREATE TABLE dt (id int PRIMARY KEY, gen int NOT NULL, pad text, "
                     "big text, gone int) USING gsnap WITH (fillfactor = 80)")
        conn.execute("ALTER TABLE dt ALTER big SET STORAGE EXTERNAL")
        conn.execute("INSERT INTO dt SELECT g, 0, repeat('x', 150), NULL, g FROM "
                     "generate_series(1, 4000) g")
        snaps, what = [snapshot(conn)], []
        where = [placed(conn, "dt")]
        for step in range(18):
            if step == 9:
                conn.execute("ALTER TABLE dt DROP COLUMN gone")
                what.append("drop column")
            elif step == 13:
                conn.execute("VACUUM FULL dt")  # a new incarnation: no base in common
                what.append("vacuum full")
            else:
                what.append(workload_step(conn, rng, step, step + 1))
            snaps.append(snapshot(conn))
            where.append(placed(conn, "dt"))
        from_deltas = 0
        for i in range(1, len(snaps)):
            a, b = snaps[i - 1], snaps[i]
            assert diff(conn, "dt", a, b) == truth(conn, "dt", a, b), (what[i - 1], a, b)
            # gsnap_diff_at: the same rows, each at the TID it had at its snapshot
            at = conn.execute(f"SELECT change, rec::text, at::text, (rec).id "
                              f"FROM gsnap_diff_at(NULL::dt, {a}, {b})").fetchall()
            assert sorted((c, r) for c, r, _, _ in at) == diff(conn, "dt", a, b)
            for change, side in (("added", where[i]), ("removed", where[i - 1])):
                mine = {(t, k) for c, _, t, k in at if c == change}
                assert mine <= side and len(mine) == sum(c == change for c, *_ in at), \
                    (what[i - 1], change, sorted(mine - side)[:5])
            # gsnap_diff_by_key: the same rows matched by id, each key once
            assert by_key(conn, "dt", a, b) == by_key_truth(conn, "dt", a, b), (what[i - 1], a, b)
            keyed = conn.execute(f"SELECT change, at::text, coalesce((new).id, (old).id) "
                                 f"FROM gsnap_diff_by_key(NULL::dt, {a}, {b})").fetchall()
            for change, side in (("updated", where[i]), ("added", where[i]), ("removed", where[i - 1])):
                mine = {(t, k) for c, t, k in keyed if c == change}
                assert mine <= side, (what[i - 1], change, sorted(mine - side)[:5])
            pages, deltas = reads(conn, "dt", a, b)
            if what[i - 1] in ("hot", "one", "toast"):
                # small changes of pages both snapshots hold: every page from its delta
                assert pages > 0 and deltas == pages, (what[i - 1], pages, deltas)
            if what[i - 1] == "vacuum full":
                assert deltas == 0
            from_deltas += deltas
        assert from_deltas > 100
        # distant pairs: a delta's base is the image of the snapshot before b, so blocks
        # changed more than once in between read both images
        for a, b in [(snaps[0], snaps[5]), (snaps[2], snaps[12]), (snaps[3], snaps[-1]),
                     (snaps[-1], snaps[0]), (snaps[7], snaps[7])]:
            assert diff(conn, "dt", a, b) == truth(conn, "dt", a, b), (a, b)
        # the store counts them (estimates)
        entries, nbytes = conn.execute(
            "SELECT delta_entries, delta_bytes FROM gsnap_store_stats()").fetchone()
        assert entries >= from_deltas // 2 and nbytes > 0, (entries, nbytes, from_deltas)
        # gsnap_diff's function form reads the same way
        a, b = snaps[0], snaps[1]
        assert sorted(conn.execute(
            f"SELECT change, rec::text FROM gsnap_diff(NULL::dt, {a}, {b}) WITH ORDINALITY"
        ).fetchall()) == truth(conn, "dt", a, b)


def test_deleted_snapshots_and_deltas_turned_off(cluster):
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE dd (id int PRIMARY KEY, v int, pad text) USING gsnap "
                     "WITH (fillfactor = 80)")
        conn.execute("INSERT INTO dd SELECT g, 0, repeat('p', 100) FROM generate_series(1, 3000) g")
        s = [snapshot(conn)]
        for k in range(1, 4):
            # the same pages change at every step (ids % 50 = 0: one or two rows per page)
            conn.execute("UPDATE dd SET v = %s WHERE id %% 50 = 0", (k,))
            s.append(snapshot(conn))
        for a, b in zip(s, s[1:]):
            pages, deltas = reads(conn, "dd", a, b)
            assert pages > 30 and deltas == pages
            assert diff(conn, "dd", a, b) == truth(conn, "dd", a, b)
        # s1..s3 skips the images of s2: the deltas of s3 start from s2's images
        pages, deltas = reads(conn, "dd", s[1], s[3])
        assert pages > 30 and deltas == 0
        assert diff(conn, "dd", s[1], s[3]) == truth(conn, "dd", s[1], s[3])
        # deleting s2 frees its images and their deltas; s1..s3 still reads images, right
        want = truth(conn, "dd", s[1], s[3])
        conn.execute(f"SELECT gsnap_delete({s[2]})")
        wait_reclaimed(conn, [s[2]])
        assert diff(conn, "dd", s[1], s[3]) == want
        pages, deltas = reads(conn, "dd", s[1], s[3])
        assert pages > 30 and deltas == 0
        assert diff(conn, "dd", s[0], s[3]) == truth(conn, "dd", s[0], s[3])

        set_deltas(conn, False)
        try:
            conn.execute("UPDATE dd SET v = 9 WHERE id % 50 = 0")
            off = snapshot(conn)
            pages, deltas = reads(conn, "dd", s[3], off)
            assert pages > 30 and deltas == 0
            assert diff(conn, "dd", s[3], off) == truth(conn, "dd", s[3], off)
        finally:
            set_deltas(conn, True)
        conn.execute("UPDATE dd SET v = 10 WHERE id % 50 = 0")
        on = snapshot(conn)
        pages, deltas = reads(conn, "dd", off, on)
        assert pages > 30 and deltas == pages
        assert diff(conn, "dd", off, on) == truth(conn, "dd", off, on)


def version_truth(conn, table: str, a: int, b: int) -> list:
    """The runs of consecutive readable snapshots of a..b in which gsnap_range holds each
    row contents (first_snap, last_snap, rec text): what gsnap_versions must return (every
    write below stamps a new gen, so equal contents are one version)."""
    snaps = [s for (s,) in conn.execute(
        "SELECT snap_id FROM gsnap_snapshots() WHERE state = 'committed' AND snap_id BETWEEN %s AND %s"
        " ORDER BY 1", (a, b)).fetchall()]
    at = {s: i for i, s in enumerate(snaps)}
    where: dict[str, list[int]] = {}
    for snap, rec in conn.execute(f"SELECT snap_id, rec::text FROM gsnap_range(NULL::{table}, {a}, {b})"):
        where.setdefault(rec, []).append(at[snap])
    out = []
    for rec, positions in where.items():
        positions.sort()
        start = prev = positions[0]
        for p in positions[1:] + [None]:
            if p != prev + 1:
                out.append((snaps[start], snaps[prev], rec))
                start = p
            prev = p
    return sorted(out)


def versions_read(conn, q: str) -> tuple[int, int]:
    """(images, deltas) EXPLAIN ANALYZE says a versions or range aggregate node read."""
    shown = "\n".join(r[0] for r in conn.execute(f"EXPLAIN (ANALYZE, COSTS OFF) {q}").fetchall())
    m = re.search(r"Pages Read: (\d+) images, (\d+) from deltas", shown)
    assert m, shown
    return int(m.group(1)), int(m.group(2))


def test_versions_and_per_snapshot_aggregates_read_deltas(cluster):
    """gsnap_versions and GROUP BY snap_id over gsnap_range read each block's first image of
    the range and then its deltas (issue 9, points 1 and 2): the versions equal the runs of
    gsnap_range and the aggregates the ones PostgreSQL computes, over snapshots taken with
    deltas, without (gsnap.page_deltas off for a while), across deleted and reclaimed
    snapshots (a delta whose base is gone: that block's images are read), and over a block
    with more runs than one group of loads (a row updated at every snapshot)."""
    rng = random.Random(91)
    with cluster.connect() as conn:
        conn.autocommit = True
        conn.execute("CREATE TABLE hv (id int PRIMARY KEY, gen int NOT NULL, pad text) USING gsnap")
        conn.execute("INSERT INTO hv SELECT g, g, repeat('p', 40) FROM generate_series(1, 3000) g")
        gen = 3000
        snaps = [snapshot(conn)]
        off = range(30, 42)
        for step in range(80):
            if step == off.start:
                set_deltas(conn, False)
            if step == off.stop:
                set_deltas(conn, True)
            ids = rng.sample(range(1, 3000), 30)
            for i in ids[:20]:  # HOT: gen only
                gen += 1
                conn.execute("UPDATE hv SET gen = %s WHERE id = %s", (gen, i))
            for i in ids[20:25]:  # grows: moves to another page
                gen += 1
                conn.execute("UPDATE hv SET gen = %s, pad = repeat('q', %s) WHERE id = %s",
                             (gen, rng.randint(60, 400), i))
            conn.execute("DELETE FROM hv WHERE id = ANY(%s)", (ids[25:],))
            gen += 1
            conn.execute("INSERT INTO hv SELECT i, %s, 'back' FROM unnest(%s::int[]) i", (gen, ids[25:]))
            gen += 1
            conn.execute("UPDATE hv SET gen = %s WHERE id = 3000", (gen,))  # every snapshot
            if step % 20 == 19:
                conn.execute("VACUUM hv")
            snaps.append(snapshot(conn))
        a, b = snaps[0], snaps[-1]
        vq = f"SELECT first_snap, last_snap, rec::text FROM gsnap_versions(NULL::hv, {a}, {b})"
        agg = "SELECT snap_id, count(*), sum((rec).gen) FROM gsnap_range(NULL::hv, {a}, {b}){o} GROUP BY 1 ORDER BY 1"

        def check(a: int, b: int, deltas_per_image: float):
            got = sorted(conn.execute(vq.replace(f"hv, {snaps[0]}, {snaps[-1]}", f"hv, {a}, {b}")).fetchall())
            assert got == version_truth(conn, "hv", a, b), (a, b)
            ours = agg.format(a=a, b=b, o="")
            assert "gsnap range aggregate" in "\n".join(r[0] for r in conn.execute(f"EXPLAIN {ours}"))
            assert conn.execute(ours).fetchall() == conn.execute(agg.format(a=a, b=b, o=" WITH ORDINALITY")).fetchall()
            images, deltas = versions_read(conn, vq.replace(f"hv, {snaps[0]}, {snaps[-1]}", f"hv, {a}, {b}"))
            assert (images, deltas) == versions_read(conn, ours)
            if deltas_per_image:
                assert deltas > deltas_per_image * images > 0, (a, b, images, deltas)
            else:
                assert deltas == 0 and images > 0, (a, b, images, deltas)

        check(a, b, 2)
        check(snaps[off.start + 2], snaps[off.stop - 1], 0)  # no deltas in that range
        check(snaps[off.start - 5], snaps[off.stop + 5], 0.5)  # deltas missing in the middle
        # deleted and reclaimed snapshots: the deltas of the images after them have no base
        dropped = [snaps[3], snaps[10], snaps[11], snaps[60]]
        conn.execute("SELECT gsnap_delete(%s::bigint[])", (dropped,))
        wait_reclaimed(conn, dropped)
        check(a, b, 2)
        check(snaps[9], snaps[13], 0.5)


def test_diff_by_key_needs_a_primary_key_and_matches_composite_keys(cluster):
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE nokey (id int, v int) USING gsnap")
        conn.execute("CREATE TABLE ck (a text COLLATE \"C\", b int, v int, PRIMARY KEY (a, b)) USING gsnap")
        conn.execute("INSERT INTO nokey SELECT g, g FROM generate_series(1, 10) g")
        conn.execute("INSERT INTO ck SELECT 'k' || (g % 7), g, 0 FROM generate_series(1, 300) g")
        a = snapshot(conn)
        conn.execute("UPDATE ck SET v = 1 WHERE b % 10 = 0")
        conn.execute("DELETE FROM ck WHERE b % 25 = 0")
        conn.execute("INSERT INTO ck VALUES ('new', 1, 5), ('k1', 1000, 5)")
        b = snapshot(conn)
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            conn.execute(f"SELECT * FROM gsnap_diff_by_key(NULL::nokey, {a}, {b})")
        got = sorted(conn.execute(f"SELECT change, coalesce((old).a, (new).a), coalesce((old).b, (new).b) "
                                  f"FROM gsnap_diff_by_key(NULL::ck, {a}, {b})").fetchall())
        updated = [("updated", f"k{g % 7}", g) for g in range(1, 301) if g % 10 == 0 and g % 25 != 0]
        removed = [("removed", f"k{g % 7}", g) for g in range(1, 301) if g % 25 == 0]
        assert got == sorted(updated + removed + [("added", "new", 1), ("added", "k1", 1000)])
