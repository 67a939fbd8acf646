"""Parallel AS OF, range and versions scans (issue 8, point 6).

`gsnap_asof` is PARALLEL SAFE and its custom scan parallel-aware: under a Gather, the leader
resolves the snapshot argument once and every participant reads the blocks it takes from a
cursor in the parallel query's shared memory. Differential: every parallel read returns
exactly the rows the table had at the snapshot (each once: a Counter of rows would show a
duplicate or a loss), through heap tuple slots (no dropped column) and virtual ones (a dropped
column), with TOASTed values, aggregates split into partial ones, the time form, a prepared
statement's parameter re-resolved on each execution and a Gather rescanned under a nested loop;
the workers apply the reading role's privileges and policies; errors and cancellations in the
middle of a parallel scan leave no pinned image behind. The AS OF scan of a partitioned table
is parallel too: the participants read its partitions one after another, sharing each one's
blocks, and so are its range and versions scans.
`gsnap_range` and `gsnap_versions` are parallel the same way, blocks being taken over the
table's incarnations one after another: every (snapshot, row) of a range and every version
with its run comes out once, equal to the serial scan's and to the per-snapshot truth.
"""

import random
import time
from collections import Counter

import pytest

from cluster import cancelled_part_way, gsnap_cluster, in_threads, reset_timeout, rows, snapshot, sqlstate

# A small image cache: three participants' batches and their prefetches share it.
CONF = ["gsnap.image_cache_size = 4MB", "max_worker_processes = 12", "max_parallel_workers = 8"]

PARALLEL = ["SET max_parallel_workers_per_gather = 2", "SET parallel_setup_cost = 0",
            "SET parallel_tuple_cost = 0", "SET min_parallel_table_scan_size = 0"]


@pytest.fixture(scope="module")
def cluster():
    yield from gsnap_cluster("parallel", CONF)


@pytest.fixture()
def conn(cluster):
    with cluster.connect() as c:
        c.autocommit = True
        yield c


def parallel(conn) -> None:
    for s in PARALLEL:
        conn.execute(s)


def serial(conn) -> None:
    conn.execute("SET max_parallel_workers_per_gather = 0")


def plan(conn, query: str, *args) -> str:
    return "\n".join(r[0] for r in conn.execute("EXPLAIN (COSTS OFF) " + query, args or None))


def analyzed(conn, query: str, *args) -> str:
    return "\n".join(r[0] for r in conn.execute(
        "EXPLAIN (ANALYZE, VERBOSE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + query, args or None))


def worker_rows(explain: str, node: str = "gsnap AS OF") -> list[int]:
    """The rows each worker's part of the parallel scan returned (EXPLAIN VERBOSE)."""
    lines = explain.splitlines()
    at = next(i for i, line in enumerate(lines) if f"Parallel Custom Scan ({node})" in line)
    found = []
    for line in lines[at + 1:]:
        if "->" in line:
            break
        if "Worker " in line and "actual rows=" in line:
            found.append(int(line.split("actual rows=")[1].split()[0]))
    return found


JOIN_METHODS = ["enable_hashjoin", "enable_mergejoin", "enable_material", "enable_memoize"]


def rescanned_under_a_nested_loop(conn, outer: str) -> None:
    """Joins plan as nested loops that scan their inner side again for each row of `outer`, a
    temporary table of the rows 1, 2, 3 (a temporary table keeps the join itself in the
    leader); undone by `reset_join_methods`."""
    for s in JOIN_METHODS:
        conn.execute(f"SET {s} = off")
    conn.execute(f"CREATE TEMP TABLE {outer} (k int)")
    conn.execute(f"INSERT INTO {outer} VALUES (1), (2), (3)")
    conn.execute(f"ANALYZE {outer}")


def reset_join_methods(conn) -> None:
    for s in JOIN_METHODS:
        conn.execute(f"RESET {s}")


def assert_gather_rescanned(conn, query: str, node: str, rows_per_loop: int) -> None:
    """`query` ran a Gather over the parallel `node` scan three times under a nested loop,
    each time returning `rows_per_loop` rows."""
    explain = analyzed(conn, query)
    assert "Nested Loop" in explain and f"Gather (actual rows={rows_per_loop} loops=3)" in explain, explain
    assert f"Parallel Custom Scan ({node})" in explain, explain


def make_table(conn, name: str, n: int, dropped: bool) -> None:
    junk = ", junk int" if dropped else ""
    conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY{junk}, v int, note text) USING gsnap")
    cols = "id, junk, v, note" if dropped else "id, v, note"
    junk_value = "g, " if dropped else ""
    # every 500th row has a value stored out of line (incompressible, 4 KB)
    conn.execute(f"INSERT INTO {name} ({cols}) SELECT g, {junk_value}g % 1000, "
                 "CASE WHEN g % 500 = 0 THEN (SELECT string_agg(md5(g::text || i::text), '') "
                 "FROM generate_series(1, 128) i) ELSE 'note ' || g END "
                 f"FROM generate_series(1, {n}) g")
    if dropped:
        conn.execute(f"ALTER TABLE {name} DROP COLUMN junk")


def change(conn, name: str, rng: random.Random) -> None:
    k = rng.randrange(2, 9)
    conn.execute(f"UPDATE {name} SET v = v + 1, note = note || '!' WHERE id % {k} = 0")
    conn.execute(f"DELETE FROM {name} WHERE id % 97 = {rng.randrange(97)}")
    top = conn.execute(f"SELECT max(id) FROM {name}").fetchone()[0]
    conn.execute(f"INSERT INTO {name} (id, v, note) SELECT g, 7, 'new' FROM generate_series({top + 1}, {top + 500}) g")


def serial_asof_matches(conn, t: str, truths: dict) -> None:
    """With parallel plans off, the AS OF scan of `t` at each snapshot of `truths` is serial
    and returns its rows (id, v, note) there."""
    serial(conn)
    for snap, truth in truths.items():
        q = f"SELECT id, v, note FROM gsnap_asof(NULL::{t}, {snap})"
        assert "Parallel" not in plan(conn, q)
        assert rows(conn, q) == truth


def parallel_asof_matches(conn, t: str, snap: int, truth: Counter) -> None:
    """The parallel AS OF scan of `t` (columns id, v, note) at `snap` returns `truth`, with the
    leader taking part and with the workers alone, each of them reading part of the blocks
    (a worker may start late and find the blocks gone: retried), and partial aggregates in
    each participant give the truth's."""
    q = f"SELECT id, v, note FROM gsnap_asof(NULL::{t}, {snap})"
    p = plan(conn, q)
    assert "Gather" in p and "Parallel Custom Scan (gsnap AS OF)" in p, p
    assert rows(conn, q) == truth, f"snapshot {snap}"
    conn.execute("SET parallel_leader_participation = off")
    try:
        for _ in range(10):
            explain = analyzed(conn, q)
            assert "Workers Launched: 2" in explain, explain
            per_worker = worker_rows(explain)
            assert len(per_worker) == 2 and sum(per_worker) == sum(truth.values()), explain
            if all(r > 0 for r in per_worker):
                break
        else:
            pytest.fail(f"one worker read every block in 10 runs: {explain}")
        assert rows(conn, q) == truth, f"snapshot {snap}, workers only"
    finally:
        conn.execute("RESET parallel_leader_participation")
    agg = f"SELECT count(*), sum(v), sum(length(note)) FROM gsnap_asof(NULL::{t}, {snap})"
    p = plan(conn, agg)
    assert "Partial Aggregate" in p and "Parallel Custom Scan" in p, p
    expected = (sum(truth.values()), sum(r[1] * c for r, c in truth.items()),
                sum(len(r[2]) * c for r, c in truth.items()))
    assert conn.execute(agg).fetchone() == expected


@pytest.mark.parametrize("dropped", [False, True], ids=["heap-slot", "dropped-column"])
def test_a_parallel_as_of_scan_returns_each_row_of_its_snapshot_once(conn, dropped):
    rng = random.Random(8)
    t = "par_drop" if dropped else "par_flat"
    make_table(conn, t, 60000, dropped)
    truths = {}
    for i in range(3):
        label = f"{t} #{i}"
        snap = conn.execute("SELECT gsnap_snapshot(label => %s)", (label,)).fetchone()[0]
        truths[snap] = rows(conn, f"SELECT id, v, note FROM {t}")
        change(conn, t, rng)
    parallel(conn)
    for snap, truth in truths.items():
        parallel_asof_matches(conn, t, snap, truth)
    # the text form, by label and by id written as text: resolved once, in the leader
    for i, (snap, truth) in enumerate(sorted(truths.items())):
        for name in (f"{t} #{i}", str(snap)):
            q = f"SELECT id, v, note FROM gsnap_asof(NULL::{t}, '{name}')"
            assert "Parallel Custom Scan (gsnap AS OF)" in plan(conn, q)
            assert rows(conn, q) == truth, name
    # the time form resolves once, in the leader: the latest snapshot
    latest = max(truths)
    q = f"SELECT id, v, note FROM gsnap_asof(NULL::{t}, now())"
    assert "Parallel Custom Scan (gsnap AS OF)" in plan(conn, q)
    assert rows(conn, q) == truths[latest]
    # a generic plan's parameter: re-resolved at each execution
    conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        conn.execute(f"PREPARE par_q_{t}(bigint) AS SELECT id, v, note FROM gsnap_asof(NULL::{t}, $1)")
        assert "Parallel Custom Scan" in plan(conn, f"EXECUTE par_q_{t}({latest})")
        for snap in sorted(truths, reverse=True) * 2:
            assert rows(conn, f"EXECUTE par_q_{t}({snap})") == truths[snap], f"EXECUTE {snap}"
    finally:
        conn.execute("RESET plan_cache_mode")
        conn.execute(f"DEALLOCATE par_q_{t}")
    # the same rows as a serial scan
    serial_asof_matches(conn, t, truths)


def test_participants_decompress_the_images_they_read(conn):
    """The participants of a parallel AS OF scan are handed the images' stored records and
    decompress them themselves, so that decompression grows with the participants instead of
    falling to the one worker; a serial scan leaves it to the worker (which decompresses the
    next batch while the scan reads this one). An image already cached decompressed is used
    as it is. `gsnap_index_stats().images_decompressed_by_readers` counts the participants'."""
    t = "par_decode"
    make_table(conn, t, 20000, False)
    snap = snapshot(conn)
    pages = conn.execute(f"SELECT pg_relation_size('{t}') / 8192").fetchone()[0]
    truth = rows(conn, f"SELECT id, v, note FROM {t}")
    conn.execute(f"UPDATE {t} SET v = -v")
    q = f"SELECT id, v, note FROM gsnap_asof(NULL::{t}, {snap})"

    def decoded_by_readers(read) -> int:
        before = conn.execute(
            "SELECT images_decompressed_by_readers FROM gsnap_index_stats()").fetchone()[0]
        read()
        return conn.execute(
            "SELECT images_decompressed_by_readers FROM gsnap_index_stats()").fetchone()[0] - before

    parallel(conn)
    assert "Parallel Custom Scan (gsnap AS OF)" in plan(conn, q)
    got = {}
    n = decoded_by_readers(lambda: got.update(par=rows(conn, q)))
    assert got["par"] == truth
    # each page image once (the snapshot's images were in no cache before this read)
    assert pages - 1 <= n <= pages, (n, pages)
    serial(conn)
    n = decoded_by_readers(lambda: got.update(ser=rows(conn, q)))
    assert got["ser"] == truth
    assert n == 0, f"a serial scan decompressed {n} images itself"
    # now every image is cached decompressed (the serial read's): the participants use them
    parallel(conn)
    n = decoded_by_readers(lambda: got.update(again=rows(conn, q)))
    assert got["again"] == truth
    assert n == 0, f"{n} images decompressed again"
    # with gsnap.verify_images, each participant checks the images it decompresses against
    # their fingerprints (the next snapshot's pages: all changed, new images in no cache)
    later = snapshot(conn)
    truth = rows(conn, f"SELECT id, v, note FROM {t}")
    pages = conn.execute(f"SELECT pg_relation_size('{t}') / 8192").fetchone()[0]
    conn.execute("ALTER SYSTEM SET gsnap.verify_images = on")
    conn.execute("SELECT pg_reload_conf()")
    try:
        q = f"SELECT id, v, note FROM gsnap_asof(NULL::{t}, {later})"
        n = decoded_by_readers(lambda: got.update(verified=rows(conn, q)))
        assert got["verified"] == truth
        assert pages - 1 <= n <= pages, (n, pages)
    finally:
        conn.execute("ALTER SYSTEM RESET gsnap.verify_images")
        conn.execute("SELECT pg_reload_conf()")


def test_concurrent_parallel_scans_through_a_small_cache(cluster, conn):
    """Five parallel scans and a serial one of the same snapshots at once, through an image
    cache smaller than the table and smaller than all their batches together: participants
    turn the records they alone pin into images, find records other scans pin, images others
    are still writing (the worker hands them out once written) and images a serial scan
    cached. No participant holds a batch while it waits for its leader to take its rows
    (before, a leader waiting for room in the cache while its workers waited for it, holding
    their batches, waited forever). Every scan returns its snapshot's rows, and afterwards a
    parallel scan of a table larger than the cache still reads every row (no slot was left
    pinned or half written)."""
    t = "par_busy"
    make_table(conn, t, 60000, False)
    rng = random.Random(11)
    truths = {}
    for _ in range(3):
        truths[snapshot(conn)] = rows(conn, f"SELECT id, v, note FROM {t}")
        change(conn, t, rng)
    snaps = sorted(truths)
    results = []

    def scan(i: int) -> None:
        with cluster.connect() as c:
            c.autocommit = True
            # a scan waiting for the cache forever fails instead of hanging the suite
            c.execute("SET statement_timeout = '60s'")
            if i == 3:
                serial(c)
            else:
                parallel(c)
            for k in range(8):
                snap = snaps[(i + k) % len(snaps)]
                got = rows(c, f"SELECT id, v, note FROM gsnap_asof(NULL::{t}, {snap})")
                results.append((i, snap, got == truths[snap]))

    failures = in_threads(scan, 6, 300)
    assert not failures, failures
    assert len(results) == 48 and all(ok for _, _, ok in results), results
    # nothing left pinned: a scan of a table larger than the cache (4 MB) gets through it
    big = "par_busy_big"
    make_table(conn, big, 150000, False)
    snap = snapshot(conn)
    truth = rows(conn, f"SELECT id, v FROM {big}")
    parallel(conn)
    conn.execute("SET statement_timeout = '120s'")
    try:
        assert rows(conn, f"SELECT id, v FROM gsnap_asof(NULL::{big}, {snap})") == truth
    finally:
        reset_timeout(conn)
    assert "terminated by signal" not in cluster.log()


def test_a_rescanned_gather_reads_the_snapshot_again(conn):
    """A Gather on the inner side of a nested loop is rescanned for each outer row (the
    outer side is a temporary table, which keeps the join itself in the leader): the leader
    starts the shared cursor again, and each rescan returns every row once more."""
    t = "par_rescan"
    make_table(conn, t, 20000, False)
    snap = snapshot(conn)
    truth = rows(conn, f"SELECT id, v FROM {t}")
    conn.execute(f"UPDATE {t} SET v = -v")
    parallel(conn)
    rescanned_under_a_nested_loop(conn, "par_outer")
    try:
        q = (f"SELECT o.k, a.id, a.v FROM par_outer o "
             f"JOIN gsnap_asof(NULL::{t}, {snap}) a ON a.id % 3 = o.k - 1")
        assert_gather_rescanned(conn, q, "gsnap AS OF", 20000)
        got = rows(conn, q)
        expected = Counter()
        for (id_, v), c in truth.items():
            expected[(id_ % 3 + 1, id_, v)] += c
        assert got == expected
    finally:
        reset_join_methods(conn)


def test_parallel_workers_apply_the_readers_privileges_and_policies(conn):
    conn.execute("CREATE ROLE par_reader LOGIN")
    conn.execute("CREATE TABLE par_docs (id int PRIMARY KEY, owner text, secret text, v int) USING gsnap")
    conn.execute("INSERT INTO par_docs SELECT g, (ARRAY['par_reader','other'])[1 + g % 2], "
                 "'secret ' || g, g FROM generate_series(1, 40000) g")
    conn.execute("GRANT SELECT (id, owner, v) ON par_docs TO par_reader")
    conn.execute("ALTER TABLE par_docs ENABLE ROW LEVEL SECURITY")
    conn.execute("CREATE POLICY mine ON par_docs FOR SELECT USING (owner = current_user)")
    conn.execute("SET ROLE par_reader")
    expected = rows(conn, "SELECT id, v FROM par_docs")  # what the policy let it read then
    conn.execute("RESET ROLE")
    assert len(expected) == 20000
    snap = snapshot(conn)
    conn.execute("UPDATE par_docs SET owner = 'other' WHERE id % 3 = 0")
    parallel(conn)
    conn.execute("SET ROLE par_reader")
    try:
        q = f"SELECT id, v FROM gsnap_asof(NULL::par_docs, {snap})"
        assert "Parallel Custom Scan (gsnap AS OF)" in plan(conn, q)
        assert rows(conn, q) == expected
        assert "Workers Launched: 2" in analyzed(conn, q)
        assert sqlstate(conn, f"SELECT id, secret FROM gsnap_asof(NULL::par_docs, {snap})") == "42501"
        r = f"SELECT (rec).id, (rec).v FROM gsnap_range(NULL::par_docs, {snap}, {snap})"
        assert "Parallel Custom Scan (gsnap range)" in plan(conn, r)
        assert rows(conn, r) == expected
        assert "Workers Launched: 2" in analyzed(conn, r)
        assert sqlstate(conn, f"SELECT (rec).secret FROM gsnap_range(NULL::par_docs, {snap}, {snap})") == "42501"
        v = f"SELECT (rec).id, (rec).v FROM gsnap_versions(NULL::par_docs, {snap}, {snap})"
        assert "Parallel Custom Scan (gsnap versions)" in plan(conn, v)
        assert rows(conn, v) == expected
    finally:
        conn.execute("RESET ROLE")


def test_errors_and_cancels_in_parallel_scans_leave_nothing_pinned(cluster, conn):
    """A parallel scan of a table several times the image cache, cancelled by
    statement_timeout at points spread over its run: afterwards the full scan still reads
    every row (no participant left images pinned), and the server never restarted."""
    t = "par_cancel"
    make_table(conn, t, 150000, False)
    snap = snapshot(conn)
    truth = rows(conn, f"SELECT id, v FROM {t}")
    conn.execute(f"DELETE FROM {t} WHERE id % 2 = 0")
    parallel(conn)
    serial_error = None
    serial(conn)
    serial_error = sqlstate(conn, f"SELECT count(*) FROM gsnap_asof(NULL::{t}, 999999)")
    parallel(conn)
    assert serial_error is not None
    assert sqlstate(conn, f"SELECT count(*) FROM gsnap_asof(NULL::{t}, 999999)") == serial_error
    q = f"SELECT id, v FROM gsnap_asof(NULL::{t}, {snap})"
    assert rows(conn, q) == truth
    agg = f"SELECT count(*), sum(v) FROM gsnap_asof(NULL::{t}, {snap})"
    expected = (sum(truth.values()), sum(r[1] * c for r, c in truth.items()))
    full = 1e9
    for _ in range(2):
        t0 = time.monotonic()
        assert conn.execute(agg).fetchone() == expected
        full = min(full, time.monotonic() - t0)
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    cancelled = cancelled_part_way(conn, agg, 12, full)
    assert cancelled >= 3, "too few scans were cancelled to test anything"
    assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid, "the session survived"
    assert rows(conn, q) == truth
    assert conn.execute(agg).fetchone() == expected
    assert "terminated by signal" not in cluster.log()


def range_rows(conn, t: str, first, last, where: str = "true") -> Counter:
    return rows(conn, f"SELECT snap_id, (rec).id, (rec).v, (rec).note "
                      f"FROM gsnap_range(NULL::{t}, {first}, {last}) WHERE {where}")


def version_rows(conn, t: str, first, last, where: str = "true") -> Counter:
    return rows(conn, f"SELECT first_snap, last_snap, (rec).id, (rec).v, (rec).note "
                      f"FROM gsnap_versions(NULL::{t}, {first}, {last}) WHERE {where}")


def parallel_range_matches(conn, t: str, truths: dict) -> tuple[Counter, Counter]:
    """The parallel range and versions of `t` over the snapshots of `truths` (its rows at
    each): every (snapshot, row) of the range is the truth, the versions are the serial ones
    and their runs expand to the truth again, both with the leader taking part and with the
    workers alone, each of them reading part of the blocks. Returns the range's rows and the
    versions, as the truth has them (left with parallel plans on)."""
    first, last = min(truths), max(truths)
    expected = Counter()
    for snap, truth in truths.items():
        for r, c in truth.items():
            expected[(snap, *r)] += c
    serial(conn)
    serial_versions = version_rows(conn, t, first, last)
    assert range_rows(conn, t, first, last) == expected
    parallel(conn)
    q = f"SELECT snap_id, (rec).id FROM gsnap_range(NULL::{t}, {first}, {last})"
    assert "Parallel Custom Scan (gsnap range)" in plan(conn, q), plan(conn, q)
    v = f"SELECT first_snap, (rec).id FROM gsnap_versions(NULL::{t}, {first}, {last})"
    assert "Parallel Custom Scan (gsnap versions)" in plan(conn, v), plan(conn, v)
    assert range_rows(conn, t, first, last) == expected
    assert version_rows(conn, t, first, last) == serial_versions
    # each version's run expanded over the range's snapshots is the truth again
    runs = Counter()
    for (a, b, *r), c in serial_versions.items():
        for snap in truths:
            if a <= snap <= b:
                runs[(snap, *r)] += c
    assert runs == expected
    # with the leader only collecting, both workers read part of the blocks
    conn.execute("SET parallel_leader_participation = off")
    try:
        for query, node in ((q, "gsnap range"), (v, "gsnap versions")):
            for _ in range(10):
                explain = analyzed(conn, query)
                per_worker = worker_rows(explain, node)
                assert len(per_worker) == 2, explain
                if all(r > 0 for r in per_worker):
                    break
            else:
                pytest.fail(f"one worker read every block in 10 runs: {explain}")
        assert range_rows(conn, t, first, last) == expected
        assert version_rows(conn, t, first, last) == serial_versions
    finally:
        conn.execute("RESET parallel_leader_participation")
    return expected, serial_versions


def test_parallel_range_and_versions_hand_out_each_row_version_once(conn):
    """Snapshots of a table that changes between them, rewritten once (VACUUM FULL: a second
    incarnation, whose blocks the participants take after the first's) and whose row type
    changes once: the parallel range equals the truth at every snapshot, the parallel
    versions equal the serial ones (each run whole, from one participant), both workers
    take part, and the Row Filter and aggregates work above them."""
    rng = random.Random(9)
    t = "par_range"
    make_table(conn, t, 40000, False)
    truths = {}
    began = conn.execute("SELECT clock_timestamp()::text").fetchone()[0]
    for i in range(5):
        truths[snapshot(conn)] = rows(conn, f"SELECT id, v, note FROM {t}")
        change(conn, t, rng)
        if i == 1:
            conn.execute(f"VACUUM FULL {t}")
        if i == 2:
            conn.execute(f"ALTER TABLE {t} ADD COLUMN extra int DEFAULT 5")
    ended = conn.execute("SELECT clock_timestamp()::text").fetchone()[0]
    first, last = min(truths), max(truths)
    expected, serial_versions = parallel_range_matches(conn, t, truths)
    # the same range written as the times it was taken between (the text form, resolved
    # once in the leader: from the first snapshot at or after the start)
    p = plan(conn, f"SELECT * FROM gsnap_range(NULL::{t}, '{began}', '{ended}')")
    assert "Parallel Custom Scan (gsnap range)" in p, p
    assert range_rows(conn, t, f"'{began}'", f"'{ended}'") == expected
    assert version_rows(conn, t, f"'{began}'", f"'{ended}'") == serial_versions
    # the Row Filter, checked once per version in each participant
    where = "(rec).v % 5 = 0"
    p = plan(conn, f"SELECT snap_id FROM gsnap_range(NULL::{t}, {first}, {last}) WHERE {where}")
    assert "Parallel Custom Scan (gsnap range)" in p and "Row Filter" in p, p
    assert range_rows(conn, t, first, last, where) == Counter(
        {k: c for k, c in expected.items() if k[2] % 5 == 0})
    assert version_rows(conn, t, first, last, where) == Counter(
        {k: c for k, c in serial_versions.items() if k[3] % 5 == 0})
    # a metric per snapshot
    agg = (f"SELECT snap_id, count(*), sum((rec).v) FROM gsnap_range(NULL::{t}, {first}, {last}) "
           "GROUP BY snap_id ORDER BY snap_id")
    assert conn.execute(agg).fetchall() == [
        (snap, sum(truth.values()), sum(r[1] * c for r, c in truth.items()))
        for snap, truth in sorted(truths.items())]


def test_a_rescanned_gather_reads_the_range_again(conn):
    """As for AS OF: a parallel range under a nested loop is scanned again per outer row,
    the leader starting the shared cursor again each time."""
    t = "par_range_rescan"
    make_table(conn, t, 20000, False)
    a = snapshot(conn)
    conn.execute(f"UPDATE {t} SET v = -v WHERE id % 2 = 0")
    b = snapshot(conn)
    truth = rows(conn, f"SELECT snap_id, (rec).id, (rec).v FROM gsnap_range(NULL::{t}, {a}, {b})")
    assert sum(truth.values()) == 40000
    parallel(conn)
    rescanned_under_a_nested_loop(conn, "par_range_outer")
    try:
        q = (f"SELECT o.k, r.snap_id, (r.rec).id, (r.rec).v FROM par_range_outer o "
             f"JOIN gsnap_range(NULL::{t}, {a}, {b}) r ON (r.rec).id % 3 = o.k - 1")
        assert_gather_rescanned(conn, q, "gsnap range", 40000)
        expected = Counter()
        for (snap, id_, v), c in truth.items():
            expected[(id_ % 3 + 1, snap, id_, v)] += c
        assert rows(conn, q) == expected
    finally:
        reset_join_methods(conn)


def make_partitioned(conn, name: str) -> None:
    """A partitioned table of gsnap partitions of very unequal sizes, with empty ones first,
    between and last (a parallel scan moves past a partition nobody finds a block in), and
    one whose columns are in another order (its rows are projected): partitions
    `{name}_0` to `{name}_6`."""
    conn.execute(f"CREATE TABLE {name} (id int, v int, note text) PARTITION BY RANGE (id)")
    bounds = [(-1000, 0), (0, 40000), (40000, 40010), (40010, 40020), (40020, 100000),
              (100000, 110000), (110000, 120000)]
    for i, (lo, hi) in enumerate(bounds):
        part = f"{name}_{i}"
        if i == 4:
            conn.execute(f"CREATE TABLE {part} (note text, v int, id int) USING gsnap")
            conn.execute(f"ALTER TABLE {name} ATTACH PARTITION {part} FOR VALUES FROM ({lo}) TO ({hi})")
        else:
            conn.execute(f"CREATE TABLE {part} PARTITION OF {name} FOR VALUES FROM ({lo}) TO ({hi}) USING gsnap")
    # partitions 0, 3 and 6 stay empty; 2 holds one page; 5 is filled, then emptied
    for lo, hi in [(0, 39999), (40000, 40005), (40020, 99999), (100000, 109999)]:
        conn.execute(f"INSERT INTO {name} SELECT g, g % 1000, 'note ' || g FROM generate_series({lo}, {hi}) g")
    conn.execute(f"DELETE FROM {name} WHERE id >= 100000")


def partitioned_history(conn, t: str, seed: int, after: list) -> dict:
    """`make_partitioned(t)`, then a snapshot per item of `after`, each followed by changes
    to the rows and by the item's statement (None: none; `{t}` is the table's name). Returns
    the rows (id, v, note) at each snapshot."""
    rng = random.Random(seed)
    make_partitioned(conn, t)
    truths = {}
    for statement in after:
        truths[snapshot(conn)] = rows(conn, f"SELECT id, v, note FROM {t}")
        conn.execute(f"UPDATE {t} SET v = v + 1, note = note || '!' WHERE id % {rng.randrange(2, 9)} = 0")
        conn.execute(f"DELETE FROM {t} WHERE id % 97 = {rng.randrange(97)}")
        if statement:
            conn.execute(statement.format(t=t))
    return truths


def test_a_parallel_as_of_scan_of_a_partitioned_table(conn):
    """The participants read the partitions one after another, sharing each one's blocks:
    every row of the snapshot once (those of a partition detached since included), the
    workers both reading, aggregates split into partial ones, the plan's pruning applied
    alike in every participant, a rescanned Gather reading it all again, cancellations
    leaving nothing pinned."""
    t = "par_parts"
    # partition 1 detached after the second snapshot: still read at it, not at the third
    truths = partitioned_history(conn, t, 11, [None, "ALTER TABLE {t} DETACH PARTITION {t}_1", None])
    parallel(conn)
    for snap, truth in truths.items():
        parallel_asof_matches(conn, t, snap, truth)
        # pruned by the plan's conditions: the partitions that can hold ids 40000-40019
        pruned = f"SELECT id, v, note FROM gsnap_asof(NULL::{t}, {snap}) WHERE id >= 40000 AND id < 40020"
        explain = analyzed(conn, pruned)
        assert "Parallel Custom Scan (gsnap AS OF)" in explain, explain
        assert "Partitions Read: 2 of" in explain, explain
        assert rows(conn, pruned) == Counter({r: c for r, c in truth.items() if 40000 <= r[0] < 40020})
    first = min(truths)
    rescanned_under_a_nested_loop(conn, "par_parts_outer")
    try:
        q = (f"SELECT o.k, a.id FROM par_parts_outer o "
             f"JOIN gsnap_asof(NULL::{t}, {first}) a ON a.id % 3 = o.k - 1")
        n = sum(truths[first].values())
        assert_gather_rescanned(conn, q, "gsnap AS OF", n)
        expected = Counter()
        for (id_, _v, _note), c in truths[first].items():
            expected[(id_ % 3 + 1, id_)] += c
        assert rows(conn, q) == expected and sum(expected.values()) == n
    finally:
        reset_join_methods(conn)
    # cancelled at points spread over its run (the partitions' readers are dropped in the
    # middle of a partition, the cursor wherever it is): nothing stays pinned
    agg = f"SELECT count(*), sum(v) FROM gsnap_asof(NULL::{t}, {first})"
    expected = (sum(truths[first].values()), sum(r[1] * c for r, c in truths[first].items()))
    t0 = time.monotonic()
    assert conn.execute(agg).fetchone() == expected
    assert cancelled_part_way(conn, agg, 10, time.monotonic() - t0) >= 3, "too few scans were cancelled to test anything"
    assert conn.execute(agg).fetchone() == expected
    # the same rows serially
    serial_asof_matches(conn, t, truths)


def test_parallel_range_and_versions_of_a_partitioned_table(conn):
    """The partitions' cursors (each over the snapshots at which it was a partition, one of
    them rewritten in between: two incarnations) follow each other in the shared count: every
    (snapshot, row) of the range once, every version once with its whole run, both workers
    reading, and the Row Filter's pruning applied alike in every participant."""
    t = "par_prange"
    truths = partitioned_history(conn, t, 12, [None, "VACUUM FULL {t}_1",
                                               "ALTER TABLE {t} DETACH PARTITION {t}_4", None])
    first, last = min(truths), max(truths)
    listed = {r[0] for r in conn.execute(
        f"SELECT DISTINCT snap_id FROM gsnap_range(NULL::{t}, {first}, {last})")}
    assert listed == set(truths), listed
    expected, serial_versions = parallel_range_matches(conn, t, truths)
    # conditions on rec prune partitions in every participant alike
    where = "(rec).id >= 40000 AND (rec).id < 40020"
    explain = analyzed(conn, f"SELECT snap_id, (rec).id FROM gsnap_range(NULL::{t}, {first}, {last}) WHERE {where}")
    assert "Parallel Custom Scan (gsnap range)" in explain and "Partitions Read: 2 of" in explain, explain
    assert range_rows(conn, t, first, last, where) == Counter(
        {k: c for k, c in expected.items() if 40000 <= k[1] < 40020})
    assert version_rows(conn, t, first, last, where) == Counter(
        {k: c for k, c in serial_versions.items() if 40000 <= k[2] < 40020})
