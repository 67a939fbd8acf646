"""gsnap_restore: a live table made equal to its content at a snapshot, inside the caller's
transaction, changing only the rows that differ (issue 10, point 1).

Differential: random DML after a snapshot (inserts, updates of keys and of contents,
deletes, duplicates in a table without a key, TOASTed values, NULLs), then a restore: the
live rows equal the snapshot's (as multisets), the counts of deleted, updated and inserted
rows equal the differences, and a ROLLBACK returns the live rows. Then what a DBA would
try: a condition, a copy into a new table, the time form, foreign keys in both directions,
triggers (off by default, as Oracle's FLASHBACK TABLE; on with triggers => true; ownership
needed to turn them off), privileges, a writer that waits for the restore, REPEATABLE READ,
generated and identity columns, and bad input.
"""

import random
import threading
import time
from collections import Counter

import psycopg
import pytest

from cluster import gsnap_cluster, snapshot, rows


@pytest.fixture(scope="module")
def cluster():
    yield from gsnap_cluster("restore")


@pytest.fixture()
def conn(cluster):
    with cluster.connect() as c:
        c.autocommit = True
        yield c


def restore(conn, call: str) -> tuple:
    return conn.execute(f"SELECT * FROM gsnap_restore({call})").fetchone()


def restored(conn, table: str, snap: int) -> tuple:
    """gsnap_restore of the whole table: its counts, once the table holds exactly the
    snapshot's rows."""
    counts = restore(conn, f"'{table}', {snap}")
    assert rows(conn, f"SELECT * FROM {table}") == rows(conn, f"SELECT * FROM gsnap_asof(NULL::{table}, {snap})")
    return counts


def big(rng: random.Random) -> str:
    return "".join(f"{rng.getrandbits(64):016x}" for _ in range(300))  # TOASTed, incompressible


def scramble(conn, table: str, rng: random.Random, keyed: bool, n: int) -> None:
    """Random DML on table (id, v, pad): a key that moves, contents that change, rows that
    go and come back."""
    for _ in range(n):
        op = rng.random()
        i = rng.randint(1, 300)
        if op < 0.3:
            conn.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s", (i,))
        elif op < 0.4:
            conn.execute(f"UPDATE {table} SET pad = %s WHERE id = %s", (big(rng) if rng.random() < 0.3 else None, i))
        elif op < 0.5 and keyed:
            conn.execute(f"UPDATE {table} SET id = id + 1000 WHERE id = %s", (i,))
        elif op < 0.7:
            conn.execute(f"DELETE FROM {table} WHERE id = %s", (i,))
        else:
            j = i + 2000 if keyed else i
            if keyed:
                conn.execute(f"INSERT INTO {table} VALUES (%s, %s, 'new') ON CONFLICT DO NOTHING", (j, i))
            else:
                conn.execute(f"INSERT INTO {table} VALUES (%s, %s, 'dup')", (j, i))


@pytest.mark.parametrize("keyed", [True, False], ids=["primary key", "no key"])
def test_restore_returns_exactly_the_snapshot_rows_and_rolls_back(conn, keyed):
    rng = random.Random(10 + keyed)
    t = "rk" if keyed else "rn"
    conn.execute(f"CREATE TABLE {t} (id int {'PRIMARY KEY' if keyed else ''}, v int, pad text) USING gsnap")
    conn.execute(f"INSERT INTO {t} SELECT g, g % 7, CASE WHEN g % 50 = 0 THEN NULL ELSE 'p' || g END "
                 "FROM generate_series(1, 300) g")
    if not keyed:
        conn.execute(f"INSERT INTO {t} SELECT id, v, pad FROM {t} WHERE id % 10 = 0")  # duplicates
    for round_ in range(3):
        snap = snapshot(conn)
        want = rows(conn, f"SELECT id, v, pad FROM gsnap_asof(NULL::{t}, {snap})")
        assert want == rows(conn, f"SELECT id, v, pad FROM {t}")
        scramble(conn, t, rng, keyed, 120)
        live = rows(conn, f"SELECT id, v, pad FROM {t}")
        assert live != want
        # A rollback leaves the live rows.
        conn.execute("BEGIN")
        restore(conn, f"'{t}', {snap}")
        assert rows(conn, f"SELECT id, v, pad FROM {t}") == want
        conn.execute("ROLLBACK")
        assert rows(conn, f"SELECT id, v, pad FROM {t}") == live
        deleted, updated, inserted = restore(conn, f"'{t}', {snap}")
        assert rows(conn, f"SELECT id, v, pad FROM {t}") == want, round_
        if keyed:
            old = {r[0]: r for r in want}
            now = {r[0]: r for r in live}
            assert deleted == len(now.keys() - old.keys())
            assert inserted == len(old.keys() - now.keys())
            assert updated == sum(1 for k in now.keys() & old.keys() if now[k] != old[k])
        else:
            assert updated == 0
            assert deleted == sum((live - want).values())
            assert inserted == sum((want - live).values())
        # Restoring again changes nothing.
        assert restore(conn, f"'{t}', {snap}") == (0, 0, 0)


def test_a_restore_that_may_take_a_snapshot_reads_only_what_changed(cluster, conn):
    """A keyed table restored by a role that may take snapshots, in a READ COMMITTED
    transaction that has written nothing yet, when few of its pages changed, takes a snapshot
    of the table as it is (an undo point, named in a NOTICE) and diffs the two snapshots
    (pages changed only) instead of the whole table; otherwise the whole table is compared.
    Both give the same rows and counts, with and without a condition."""
    rng = random.Random(33)
    conn.execute("CREATE TABLE rfast (id int PRIMARY KEY, v int, pad text) USING gsnap")
    # 3,000 rows on about 30 pages; the random changes below touch ids up to 300 and a few
    # new ones: few pages
    conn.execute("INSERT INTO rfast SELECT g, g % 7, 'p' || g || repeat('-', 60) FROM generate_series(1, 300) g")
    conn.execute("INSERT INTO rfast SELECT g, 0, repeat('-', 60) FROM generate_series(10001, 12700) g")
    conn.execute("CREATE TABLE rfast_other (x int)")
    conn.execute("CREATE ROLE rfast_user LOGIN")
    conn.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON rfast TO rfast_user")
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    for condition in ["", ", 'id % 3 = 0 OR v = 2'"]:
        snap = snapshot(conn)
        want_all = rows(conn, f"SELECT id, v, pad FROM gsnap_asof(NULL::rfast, {snap})")
        scramble(conn, "rfast", rng, True, 150)
        live = rows(conn, "SELECT id, v, pad FROM rfast")
        results = {}
        # the whole table compared: after a write in the transaction, under REPEATABLE READ,
        # and by a role that may not take snapshots
        for how in ["written", "repeatable read", "no snapshot privilege"]:
            notices.clear()
            if how == "no snapshot privilege":
                with cluster.connect(user="rfast_user") as r:
                    r.execute("BEGIN")
                    got = restore(r, f"'rfast', {snap}{condition}")
                    after = rows(r, "SELECT id, v, pad FROM rfast")
                    r.execute("ROLLBACK")
            else:
                conn.execute("BEGIN" if how == "written" else "BEGIN ISOLATION LEVEL REPEATABLE READ")
                if how == "written":
                    conn.execute("INSERT INTO rfast_other VALUES (1)")
                else:
                    conn.execute("LOCK TABLE rfast IN EXCLUSIVE MODE")
                got = restore(conn, f"'rfast', {snap}{condition}")
                after = rows(conn, "SELECT id, v, pad FROM rfast")
                conn.execute("ROLLBACK")
            assert not any("took snapshot" in n for n in notices), (how, notices)
            results[how] = (got, after)
        assert rows(conn, "SELECT id, v, pad FROM rfast") == live
        # the diff of two snapshots
        notices.clear()
        before = conn.execute("SELECT max(snap_id) FROM gsnap_snapshots()").fetchone()[0]
        conn.execute("BEGIN")
        got = restore(conn, f"'rfast', {snap}{condition}")
        after = rows(conn, "SELECT id, v, pad FROM rfast")
        conn.execute("COMMIT")
        taken = [n for n in notices if "took snapshot" in n]
        assert len(taken) == 1, notices
        now = conn.execute("SELECT max(snap_id) FROM gsnap_snapshots()").fetchone()[0]
        assert now == before + 1 and f"took snapshot {now} " in taken[0], taken
        for how, r in results.items():
            assert (got, after) == r, (how, condition)
        if not condition:
            assert after == want_all
        # the snapshot it took is the table before the restore: restoring it undoes the restore
        assert rows(conn, f"SELECT id, v, pad FROM gsnap_asof(NULL::rfast, {now})") == live
        restore(conn, f"'rfast', {now}")
        assert rows(conn, "SELECT id, v, pad FROM rfast") == live
    # most pages changed since the snapshot: the whole table is compared (cheaper than the
    # diff of two snapshots when many rows changed: see few_pages_changed)
    snap = snapshot(conn)
    want = rows(conn, f"SELECT id, v, pad FROM gsnap_asof(NULL::rfast, {snap})")
    conn.execute("UPDATE rfast SET v = v + 1")
    notices.clear()
    assert restore(conn, f"'rfast', {snap}")[1] == sum(want.values())
    assert not any("took snapshot" in n for n in notices), notices
    assert rows(conn, "SELECT id, v, pad FROM rfast") == want
    # the table rewritten since the snapshot (VACUUM FULL: other pages, other TIDs), however
    # few rows changed: the whole table is compared
    snap = snapshot(conn)
    conn.execute("UPDATE rfast SET v = v + 1 WHERE id % 4 = 0")
    conn.execute("VACUUM FULL rfast")
    notices.clear()
    assert restore(conn, f"'rfast', {snap}")[1] == sum(1 for r in want.elements() if r[0] % 4 == 0)
    assert not any("took snapshot" in n for n in notices), notices
    assert rows(conn, "SELECT id, v, pad FROM rfast") == want
    # a column added since the snapshot (without a rewrite: the pages do not change) has no
    # value at the snapshot: the diff of two snapshots would not see it, the whole table is
    # compared on the snapshot's columns, and the rows keep their value of it
    snap = snapshot(conn)
    conn.execute("ALTER TABLE rfast ADD COLUMN w int DEFAULT 5")
    conn.execute("UPDATE rfast SET v = v + 1 WHERE id = 1")
    notices.clear()
    assert restore(conn, f"'rfast', {snap}") == (0, 1, 0)
    assert any("took snapshot" in n and "compared the whole table" in n for n in notices), notices
    assert conn.execute("SELECT count(*) FROM rfast WHERE w IS DISTINCT FROM 5").fetchone()[0] == 0
    assert rows(conn, "SELECT id, v, pad FROM rfast") == want


def test_a_condition_restores_only_the_rows_it_matches(conn):
    conn.execute("CREATE TABLE rc (id int PRIMARY KEY, v int) USING gsnap")
    conn.execute("INSERT INTO rc SELECT g, g FROM generate_series(1, 100) g")
    snap = snapshot(conn)
    conn.execute("UPDATE rc SET v = -v")
    conn.execute("DELETE FROM rc WHERE id IN (5, 95)")
    conn.execute("INSERT INTO rc VALUES (7000, 1), (8, 8) ON CONFLICT (id) DO UPDATE SET v = 0")
    # id 8 was updated to 0, 7000 is new, 5 and 95 deleted
    assert restore(conn, f"'rc', {snap}, condition => 'id <= 10'") == (0, 9, 1)
    got = dict(conn.execute("SELECT id, v FROM rc").fetchall())
    assert all(got[i] == i for i in range(1, 11))
    assert all(got[i] == -i for i in range(11, 101) if i != 95)
    assert 95 not in got and got[7000] == 1
    # A key that matches the condition only in the snapshot, or only now, is restored too.
    snap2 = snapshot(conn)
    conn.execute("UPDATE rc SET v = 5000 WHERE id = 50")
    assert restore(conn, f"'rc', {snap2}, condition => 'v >= 5000'") == (0, 1, 0)
    assert conn.execute("SELECT v FROM rc WHERE id = 50").fetchone()[0] == -50


def test_into_copies_the_snapshot_rows_into_a_new_table(conn):
    conn.execute("CREATE TABLE ri (id int PRIMARY KEY, v text NOT NULL DEFAULT 'x', "
                 "w int GENERATED ALWAYS AS (id * 2) STORED) USING gsnap")
    conn.execute("INSERT INTO ri (id, v) SELECT g, 'v' || g FROM generate_series(1, 50) g")
    snap = snapshot(conn)
    conn.execute("DELETE FROM ri WHERE id > 10")
    assert restore(conn, f"'ri', {snap}, condition => 'id > 40', into_table => 'ri_old'") == (0, 0, 10)
    assert conn.execute("SELECT count(*), min(id), sum(w) FROM ri_old").fetchone() == (10, 41, sum(2 * i for i in range(41, 51)))
    am = conn.execute("SELECT amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE relname = 'ri_old'").fetchone()
    assert am == ("gsnap",)
    # The new table has the key (INCLUDING ALL) and the live table is untouched.
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("INSERT INTO ri_old (id) VALUES (41)")
    assert conn.execute("SELECT count(*) FROM ri").fetchone()[0] == 10
    with pytest.raises(psycopg.errors.DuplicateTable):
        restore(conn, f"'ri', {snap}, into_table => 'ri_old'")
    # Its dry run says it would be refused so (and a free name draws no such NOTICE).
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    assert restore(conn, f"'ri', {snap}, into_table => 'ri_old', dry_run => true") == (0, 0, 50)
    assert "the restore would be refused: relation ri_old already exists" in notices, notices
    notices.clear()
    assert restore(conn, f"'ri', {snap}, into_table => 'ri_free', dry_run => true") == (0, 0, 50)
    assert not [n for n in notices if "would be refused" in n], notices
    assert restore(conn, f"'ri', {snap}, into_table => 'public.\"RI Old\"'") == (0, 0, 50)
    assert conn.execute('SELECT count(*) FROM "RI Old"').fetchone()[0] == 50


def test_restore_by_time_takes_the_latest_snapshot_at_or_before_it(conn):
    conn.execute("CREATE TABLE rt (id int PRIMARY KEY, v int) USING gsnap")
    conn.execute("INSERT INTO rt VALUES (1, 1)")
    snapshot(conn)
    at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    conn.execute("UPDATE rt SET v = 2")
    snapshot(conn)
    conn.execute("UPDATE rt SET v = 3")
    assert conn.execute("SELECT * FROM gsnap_restore('rt', %s::timestamptz)", (at,)).fetchone() == (0, 1, 0)
    assert conn.execute("SELECT v FROM rt").fetchone()[0] == 1


def test_foreign_keys_are_checked_and_updates_keep_references(conn):
    conn.execute("CREATE TABLE rp (id int PRIMARY KEY, name text) USING gsnap")
    conn.execute("CREATE TABLE rch (id int PRIMARY KEY, parent int NOT NULL REFERENCES rp) USING gsnap")
    conn.execute("INSERT INTO rp SELECT g, 'p' || g FROM generate_series(1, 10) g")
    conn.execute("INSERT INTO rch SELECT g, g FROM generate_series(1, 10) g")
    snap = snapshot(conn)
    # A parent renamed since: restored by an UPDATE, its children keep pointing at it.
    conn.execute("UPDATE rp SET name = 'renamed' WHERE id = 3")
    assert restore(conn, f"'rp', {snap}") == (0, 1, 0)
    # A parent added since and referenced: deleting it would break the reference.
    conn.execute("INSERT INTO rp VALUES (11, 'new')")
    conn.execute("INSERT INTO rch VALUES (11, 11)")
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        restore(conn, f"'rp', {snap}")
    assert conn.execute("SELECT count(*) FROM rp").fetchone()[0] == 11  # all or nothing
    # A child whose parent is gone cannot come back before its parent.
    conn.execute("DELETE FROM rch WHERE id IN (2, 11)")
    conn.execute("DELETE FROM rp WHERE id IN (2, 11)")
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        restore(conn, f"'rch', {snap}")
    assert restore(conn, f"'rp', {snap}") == (0, 0, 1)
    assert restored(conn, "rch", snap) == (0, 0, 1)


def test_a_restore_its_own_delete_cascades_into_is_refused(conn):
    """A foreign key of the table on itself with ON DELETE CASCADE: deleting a row added
    since removes a row the restore was to update back. The restore would not end with the
    snapshot's rows: it raises 27000 (both ways of finding the rows) and changes nothing."""
    conn.execute("CREATE TABLE rself (id int PRIMARY KEY, parent int REFERENCES rself ON DELETE CASCADE, "
                 "v int, pad text) USING gsnap")
    conn.execute("INSERT INTO rself SELECT g, NULL, 0, repeat('x', 200) FROM generate_series(1, 3000) g")
    conn.execute("CREATE TABLE rself_other (x int)")
    snap = snapshot(conn)
    conn.execute("INSERT INTO rself VALUES (5000, NULL, 0, 'new')")
    conn.execute("UPDATE rself SET parent = 5000, v = 1 WHERE id = 5")
    live = rows(conn, "SELECT * FROM rself")
    for how in ["diff of two snapshots", "whole table"]:
        conn.execute("BEGIN")
        if how == "whole table":
            conn.execute("INSERT INTO rself_other VALUES (1)")  # a transaction that wrote
        with pytest.raises(psycopg.errors.TriggeredDataChangeViolation):
            restore(conn, f"'rself', {snap}")
        conn.execute("ROLLBACK")
        assert rows(conn, "SELECT * FROM rself") == live, how
    # Without the cascade in the way (the child restored first), the restore goes through.
    assert restore(conn, f"'rself', {snap}, condition => 'id = 5'") == (0, 1, 0)
    assert restored(conn, "rself", snap) == (1, 0, 0)


def test_a_restore_that_would_cascade_into_other_tables_is_refused(cluster, conn):
    """Deleting the orders added since (or updating a referenced column back) would run the
    ON DELETE / ON UPDATE actions (CASCADE, SET NULL, SET DEFAULT) of foreign keys of tables
    the restore does not restore, changing rows nobody named: refused (2BP01) with the
    tables, keys and row counts, and nothing changed. `cascade => true` lets them run (with
    a NOTICE saying what they changed); a dry run says what they would change; restoring
    the tables together needs neither; keys with NO ACTION, or actions no row reaches, are
    no obstacle; a heap table's key counts too; a table without a primary key (rows matched
    by contents, so a changed row is deleted and inserted) is refused the same way; a role
    that may not read the referencing table is refused without a count."""
    conn.execute("CREATE TABLE rord (id int PRIMARY KEY, code text UNIQUE, v int) USING gsnap")
    conn.execute("CREATE TABLE rline (id int PRIMARY KEY, ord int REFERENCES rord ON DELETE CASCADE, v int) USING gsnap")
    conn.execute("CREATE TABLE rnote (id int PRIMARY KEY, ord int REFERENCES rord ON DELETE SET NULL, "
                 "code text REFERENCES rord (code) ON UPDATE CASCADE)")  # heap
    conn.execute("CREATE TABLE rtag (id int PRIMARY KEY, ord int REFERENCES rord)")  # NO ACTION
    conn.execute("INSERT INTO rord SELECT g, 'c' || g, g FROM generate_series(1, 20) g")
    conn.execute("INSERT INTO rline SELECT g, g % 20 + 1, g FROM generate_series(1, 40) g")
    conn.execute("INSERT INTO rnote SELECT g, g, 'c' || g FROM generate_series(1, 5) g")
    snap = snapshot(conn)
    conn.execute("INSERT INTO rord VALUES (21, 'c21', 21), (22, 'c22', 22)")
    conn.execute("INSERT INTO rline VALUES (100, 21, 0), (101, 21, 0), (102, 22, 0)")
    conn.execute("INSERT INTO rnote VALUES (100, 22, NULL)")
    conn.execute("UPDATE rord SET code = 'renamed', v = -1 WHERE id = 3")
    conn.execute("UPDATE rnote SET code = 'renamed' WHERE id = 3")
    live = {t: rows(conn, f"SELECT * FROM {t}") for t in ("rord", "rline", "rnote")}
    with pytest.raises(psycopg.errors.DependentObjectsStillExist) as e:
        restore(conn, f"'rord', {snap}")
    message = e.value.diag.message_primary
    assert ("3 rows of rline (foreign key rline_ord_fkey, ON DELETE CASCADE)" in message
            and "1 row of rnote (foreign key rnote_ord_fkey, ON DELETE SET NULL)" in message
            and "1 row of rnote (foreign key rnote_code_fkey, ON UPDATE CASCADE)" in message
            and "rtag" not in message), message
    assert "gsnap_restore_tables" in e.value.diag.message_hint and "cascade => true" in e.value.diag.message_hint
    assert {t: rows(conn, f"SELECT * FROM {t}") for t in live} == live
    # A dry run says the same, and changes nothing.
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    assert restore(conn, f"'rord', {snap}, dry_run => true") == (2, 1, 0)
    assert any("would change" in n and "3 rows of rline" in n for n in notices), notices
    assert {t: rows(conn, f"SELECT * FROM {t}") for t in live} == live
    # A role that may restore ord but not read note: refused without counting note's rows.
    conn.execute("CREATE ROLE ord_keeper LOGIN")
    conn.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON rord, rline TO ord_keeper")
    with cluster.connect(user="ord_keeper") as k:
        with pytest.raises(psycopg.errors.DependentObjectsStillExist) as e:
            restore(k, f"'rord', {snap}")
        assert "rows this role cannot count of rnote" in e.value.diag.message_primary
    # Restored together with line, whose rows it would then put back itself: only note's
    # keys stand in the way.
    with pytest.raises(psycopg.errors.DependentObjectsStillExist) as e:
        conn.execute("SELECT * FROM gsnap_restore_tables(ARRAY['rord', 'rline'], %s)", (snap,))
    assert "of rnote" in e.value.diag.message_primary and "of rline" not in e.value.diag.message_primary
    # With cascade => true the actions run, and a NOTICE says what they changed.
    notices.clear()
    conn.execute("BEGIN")
    assert restore(conn, f"'rord', {snap}, cascade => true") == (2, 1, 0)
    assert any(n.startswith("the restore changes") and "3 rows of rline" in n for n in notices), notices
    assert conn.execute("SELECT count(*) FROM rline WHERE id >= 100").fetchone()[0] == 0
    assert conn.execute("SELECT ord, code FROM rnote WHERE id IN (3, 100) ORDER BY id").fetchall() == [
        (3, "c3"), (None, None)]
    conn.execute("ROLLBACK")
    # Nothing the actions reach: no refusal (a NO ACTION key's rows untouched).
    conn.execute("DELETE FROM rline WHERE id >= 100")
    conn.execute("DELETE FROM rnote WHERE id = 100")
    conn.execute("UPDATE rnote SET code = NULL WHERE id = 3")
    conn.execute("INSERT INTO rtag VALUES (1, 1)")
    assert restore(conn, f"'rord', {snap}") == (2, 1, 0)
    assert rows(conn, "SELECT * FROM rord") == rows(conn, f"SELECT * FROM gsnap_asof(NULL::rord, {snap})")
    # Without a primary key, a changed row is deleted and put back: its referencing rows
    # would go with it.
    conn.execute("CREATE TABLE nopk (code text UNIQUE NOT NULL, v int) USING gsnap")
    conn.execute("CREATE TABLE nopk_ref (id int, code text REFERENCES nopk (code) ON DELETE CASCADE)")
    conn.execute("INSERT INTO nopk VALUES ('a', 1), ('b', 2)")
    conn.execute("INSERT INTO nopk_ref VALUES (1, 'a'), (2, 'b')")
    snap = snapshot(conn)
    conn.execute("UPDATE nopk SET v = 10 WHERE code = 'a'")
    with pytest.raises(psycopg.errors.DependentObjectsStillExist) as e:
        restore(conn, f"'nopk', {snap}")
    assert "1 row of nopk_ref" in e.value.diag.message_primary
    assert conn.execute("SELECT id, code FROM nopk_ref ORDER BY id").fetchall() == [(1, "a"), (2, "b")]


def test_cascades_from_and_into_partitioned_tables_are_counted_once(conn):
    """A partitioned table referenced by a partitioned table (ON DELETE CASCADE): PostgreSQL
    keeps a copy of the key for every partition on both sides; the refusal counts the
    referencing rows once, for a restore of the partitioned table and of one partition."""
    conn.execute("CREATE TABLE pord (id int PRIMARY KEY, v int) PARTITION BY RANGE (id)")
    conn.execute("CREATE TABLE pord1 PARTITION OF pord FOR VALUES FROM (0) TO (100) USING gsnap")
    conn.execute("CREATE TABLE pord2 PARTITION OF pord FOR VALUES FROM (100) TO (200) USING gsnap")
    conn.execute("CREATE TABLE pline (id int, ord int REFERENCES pord ON DELETE CASCADE) PARTITION BY HASH (id)")
    conn.execute("CREATE TABLE pline0 PARTITION OF pline FOR VALUES WITH (MODULUS 2, REMAINDER 0)")
    conn.execute("CREATE TABLE pline1 PARTITION OF pline FOR VALUES WITH (MODULUS 2, REMAINDER 1)")
    conn.execute("INSERT INTO pord SELECT g, g FROM generate_series(1, 150) g")
    conn.execute("INSERT INTO pline SELECT g, g FROM generate_series(1, 150) g")
    snap = snapshot(conn)
    conn.execute("INSERT INTO pord VALUES (160, 0), (170, 0)")
    conn.execute("INSERT INTO pline SELECT g, 160 FROM generate_series(1000, 1004) g")
    conn.execute("INSERT INTO pline SELECT g, 170 FROM generate_series(2000, 2001) g")
    for table in ["pord", "pord2"]:
        with pytest.raises(psycopg.errors.DependentObjectsStillExist) as e:
            restore(conn, f"'{table}', {snap}")
        message = e.value.diag.message_primary
        assert message.endswith("through their foreign keys: 7 rows of pline (foreign key pline_ord_fkey, "
                                "ON DELETE CASCADE)"), message
    # pord1 had no row added: nothing to reach.
    assert restore(conn, f"'pord1', {snap}") == (0, 0, 0)
    conn.execute("BEGIN")
    assert restore(conn, f"'pord', {snap}, cascade => true") == (2, 0, 0)
    assert conn.execute("SELECT count(*) FROM pline").fetchone()[0] == 150
    conn.execute("ROLLBACK")


def swap_codes(conn, t: str) -> None:
    """Rows 7 and 9 of `t` exchange their codes, as a deploy could in three statements."""
    conn.execute(f"UPDATE {t} SET code = 'tmp' WHERE id = 7")
    conn.execute(f"UPDATE {t} SET code = 'c7' WHERE id = 9")
    conn.execute(f"UPDATE {t} SET code = 'c9', v = -1 WHERE id = 7")


def test_unique_values_exchanged_since_the_snapshot(conn):
    """Two rows that exchanged the values of a unique column since the snapshot: with a
    constraint PostgreSQL checks row by row (not DEFERRABLE), one UPDATE cannot put them
    back (it fails in its middle), so the restore deletes the rows that would meet a value
    another row still holds and inserts them back after the updates, in one statement, and
    says so; in both functions, and a dry run says it would. A DEFERRABLE constraint (checked
    at the end of the statement) and an index holding the primary key need nothing of it."""
    notices = []
    conn.add_notice_handler(lambda d: notices.append((d.message_primary, d.message_detail)))
    for t, constraint in [("rsw1", "UNIQUE (code)"), ("rsw2", "UNIQUE (code) DEFERRABLE"),
                          ("rsw3", "UNIQUE (id, code)")]:
        conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, code text NOT NULL, v int, {constraint}) USING gsnap")
        conn.execute(f"INSERT INTO {t} SELECT g, 'c' || g, g FROM generate_series(1, 50) g")
        snap = snapshot(conn)
        swap_codes(conn, t)
        notices.clear()
        if t != "rsw1":
            assert restored(conn, t, snap) == (0, 2, 0)
            assert not [n for n in notices if "inserted it back" in n[0]], notices
            continue
        live = rows(conn, f"SELECT * FROM {t}")
        assert restore(conn, f"'{t}', {snap}, dry_run => true") == (0, 2, 0)
        assert ("gsnap_restore of public.rsw1 would delete 1 row and insert it back: other rows "
                "held their values of unique index rsw1_code_key (code)") in [n[0] for n in notices], notices
        assert rows(conn, f"SELECT * FROM {t}") == live
        for call in [f"SELECT * FROM gsnap_restore('{t}', {snap})",
                     f"SELECT * FROM gsnap_restore_tables(ARRAY['{t}'], {snap})"]:
            notices.clear()
            got = conn.execute(call).fetchone()
            assert got[-3:] == (0, 2, 0), got
            assert rows(conn, f"SELECT * FROM {t}") == rows(conn, f"SELECT * FROM gsnap_asof(NULL::{t}, {snap})")
            [(message, detail)] = [n for n in notices if "inserted it back" in n[0]]
            assert message == ("gsnap_restore of public.rsw1 deleted 1 row and inserted it back: "
                               "other rows held their values of unique index rsw1_code_key (code)")
            assert f"exchanged those values since snapshot {snap}" in detail, detail
            swap_codes(conn, t)


def test_values_permuted_among_many_rows_are_put_back(conn):
    """Random permutations (cycles of every length) of a unique column's values among random
    rows, with rows deleted, inserted and changed around them, over several snapshots: each
    restore (both functions, with and without a condition) gives exactly the snapshot's rows,
    whatever order the UPDATE meets them in. (A condition that leaves out a row holding a
    value a restored row takes is a conflict of its own: PostgreSQL's 23505 names it.)"""
    rng = random.Random(8)
    conn.execute("CREATE TABLE rpm (id int PRIMARY KEY, code int NOT NULL UNIQUE, v int) USING gsnap")
    conn.execute("INSERT INTO rpm SELECT g, g, 0 FROM generate_series(1, 400) g")
    for round in range(6):
        snap = snapshot(conn)
        ids = [r[0] for r in conn.execute("SELECT id FROM rpm").fetchall()]
        chosen = rng.sample(ids, rng.randint(2, 120))
        codes = dict(conn.execute("SELECT id, code FROM rpm WHERE id = ANY(%s)", (chosen,)).fetchall())
        shuffled = rng.sample(list(codes.values()), len(codes))
        conn.execute("UPDATE rpm SET code = -id WHERE id = ANY(%s)", (chosen,))
        for i, code in zip(chosen, shuffled):
            conn.execute("UPDATE rpm SET code = %s, v = v + 1 WHERE id = %s", (code, i))
        others = [i for i in ids if i not in codes]
        conn.execute("DELETE FROM rpm WHERE id = ANY(%s)", (rng.sample(others, 10),))
        conn.execute("UPDATE rpm SET v = v + 1 WHERE id = ANY(%s)", (rng.sample(others, 20),))
        conn.execute("INSERT INTO rpm SELECT g, g + 100000, 0 FROM generate_series(%s::int, %s::int) g",
                     (1000 + 10 * round, 1004 + 10 * round))
        want = rows(conn, f"SELECT * FROM gsnap_asof(NULL::rpm, {snap})")
        if round % 3 == 0:
            conn.execute(f"SELECT * FROM gsnap_restore('rpm', {snap})")
        elif round % 3 == 1:
            conn.execute(f"SELECT * FROM gsnap_restore_tables(ARRAY['rpm'], {snap})")
        else:  # a condition every row meets: the diff compares rows, not pages
            conn.execute(f"SELECT * FROM gsnap_restore('rpm', {snap}, condition => 'id > 0')")
        assert rows(conn, "SELECT * FROM rpm") == want, f"round {round}"


def test_values_held_by_rows_the_restore_leaves_alone(conn):
    """A restore with a condition whose rows would take unique values that rows outside the
    condition hold now is refused before writing (23505, naming the index, saying which rows
    hold them and what to do); the dry run says it would be; a wider condition restores. The
    same for a unique index made since the snapshot that the snapshot's rows break."""
    conn.execute("CREATE TABLE rla (id int PRIMARY KEY, code text NOT NULL UNIQUE, region int) USING gsnap")
    conn.execute("INSERT INTO rla SELECT g, 'c' || g, g % 3 FROM generate_series(1, 30) g")
    snap = snapshot(conn)
    # Row 4 (region 1) gave up its code, which row 6 (region 0) then took.
    conn.execute("UPDATE rla SET code = 'moved' WHERE id = 4")
    conn.execute("UPDATE rla SET code = 'c4' WHERE id = 6")
    live = rows(conn, "SELECT * FROM rla")
    for call in [f"'rla', {snap}, condition => 'region = 1'",
                 f"'rla', {snap}, condition => 'id = 4'"]:
        with pytest.raises(psycopg.errors.UniqueViolation) as e:
            restore(conn, call)
        assert e.value.diag.message_primary == (
            "gsnap_restore of public.rla: 1 row it would put back take values of unique index "
            "rla_code_key that rows it leaves as they are hold now"), e.value.diag.message_primary
        assert e.value.diag.message_detail == "Rows its condition does not match hold those values of (code)."
        assert e.value.diag.message_hint.startswith("Widen the condition")
        assert rows(conn, "SELECT * FROM rla") == live
        notices = []
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        assert restore(conn, call + ", dry_run => true")[1] == 1
        assert any(n.startswith("the restore would be refused: gsnap_restore of public.rla: 1 row it "
                                "would put back") for n in notices), notices
    # Both rows in the condition: restored (an update of row 6 frees the value first).
    assert restore(conn, f"'rla', {snap}, condition => 'id IN (4, 6)'") == (0, 2, 0)
    assert rows(conn, "SELECT * FROM rla") == rows(conn, f"SELECT * FROM gsnap_asof(NULL::rla, {snap})")
    # An index made since, which the snapshot's rows break: refused with its own reason.
    conn.execute("CREATE TABLE rlb (id int PRIMARY KEY, tag int) USING gsnap")
    conn.execute("INSERT INTO rlb VALUES (1, 7), (2, 7), (3, 8)")
    snap = snapshot(conn)
    conn.execute("DELETE FROM rlb WHERE id = 2")
    conn.execute("CREATE UNIQUE INDEX rlb_tag ON rlb (tag)")
    with pytest.raises(psycopg.errors.UniqueViolation) as e:
        restore(conn, f"'rlb', {snap}")
    assert "unique index rlb_tag that rows it leaves as they are hold now" in e.value.diag.message_primary
    assert "the snapshot's rows break the index, made since" in e.value.diag.message_detail
    assert rows(conn, "SELECT * FROM rlb") == Counter([(1, 7), (3, 8)])


def test_exchanged_values_put_back_where_a_delete_changes_nothing_else(cluster, conn):
    """Rows put back by a delete and an insert keep what an update would have kept: rows
    referencing them by a NO ACTION foreign key (checked once they are back, at the end of
    the statement), a partitioned table's rows in their partitions, and, with triggers =>
    true, their triggers fire (delete and insert). Where a delete would do more, the restore
    is refused before writing (23505, saying why): a foreign key with an action (CASCADE,
    RESTRICT, ...) referencing the table, a column added since the snapshot (its values would
    be lost)."""
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    put_back = lambda: [n for n in notices if "inserted it back" in n or "inserted them back" in n]  # noqa: E731

    def table(t: str, extra: str = "") -> int:
        conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, code text NOT NULL UNIQUE, v int{extra}) USING gsnap")
        conn.execute(f"INSERT INTO {t} SELECT g, 'c' || g, g FROM generate_series(1, 50) g")
        return snapshot(conn)

    # A NO ACTION key by id and one by code: the children's rows stay, and still match.
    snap = table("rxa")
    conn.execute("CREATE TABLE rxa_by_id (ref int REFERENCES rxa (id))")
    conn.execute("CREATE TABLE rxa_by_code (ref text REFERENCES rxa (code) DEFERRABLE INITIALLY DEFERRED)")
    conn.execute("INSERT INTO rxa_by_id VALUES (7), (9), (9)")
    conn.execute("INSERT INTO rxa_by_code VALUES ('c7'), ('c9')")
    with conn.transaction():  # the key by code is checked at the commit
        swap_codes(conn, "rxa")
    notices.clear()
    assert restored(conn, "rxa", snap) == (0, 2, 0)
    assert len(put_back()) == 1, notices
    assert rows(conn, "SELECT * FROM rxa_by_id") == Counter([(7,), (9,), (9,)])
    assert rows(conn, "SELECT * FROM rxa_by_code") == Counter([("c7",), ("c9",)])

    # Triggers on request: the rows put back fire their delete and insert triggers.
    snap = table("rxt")
    conn.execute("CREATE TABLE rxt_log (op text, id int)")
    conn.execute("""CREATE FUNCTION rxt_audit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN INSERT INTO rxt_log VALUES (TG_OP, coalesce(NEW.id, OLD.id)); RETURN NULL; END $$""")
    conn.execute("CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON rxt "
                 "FOR EACH ROW EXECUTE FUNCTION rxt_audit()")
    swap_codes(conn, "rxt")
    conn.execute("TRUNCATE rxt_log")
    assert restore(conn, f"'rxt', {snap}, triggers => true") == (0, 2, 0)
    log = sorted(conn.execute("SELECT op, id FROM rxt_log").fetchall())
    assert [op for op, _ in log] == ["DELETE", "INSERT", "UPDATE"], log
    assert log[0][1] == log[1][1] and {log[0][1], log[2][1]} == {7, 9}, log

    # A partitioned table: rows exchanged values in both partitions.
    conn.execute("CREATE TABLE rxp (id int, region int, code text NOT NULL, v int, PRIMARY KEY (id, region), "
                 "UNIQUE (code, region)) PARTITION BY LIST (region)")
    conn.execute("CREATE TABLE rxp_1 PARTITION OF rxp FOR VALUES IN (1) USING gsnap")
    conn.execute("CREATE TABLE rxp_2 PARTITION OF rxp FOR VALUES IN (2) USING gsnap")
    conn.execute("INSERT INTO rxp SELECT g, 1 + g % 2, 'c' || (g / 2), g FROM generate_series(1, 60) g")
    snap = snapshot(conn)
    for a, b in [(4, 6), (5, 7), (10, 12)]:  # same region each (4, 6 in region 1; 5, 7 in 2)
        conn.execute(f"UPDATE rxp SET code = 'tmp' WHERE id = {a}")
        conn.execute(f"UPDATE rxp SET code = 'c{a // 2}' WHERE id = {b}")
        conn.execute(f"UPDATE rxp SET code = 'c{b // 2}', v = -{a} WHERE id = {a}")
    notices.clear()
    counts = restored(conn, "rxp", snap)
    assert counts[0] == 0 and counts[1] == 6 and counts[2] == 0, counts
    assert put_back(), notices

    # Refused where a delete would do what an update does not.
    snap = table("rxc")
    conn.execute("CREATE TABLE rxc_child (ref int REFERENCES rxc (id) ON DELETE CASCADE)")
    conn.execute("INSERT INTO rxc_child VALUES (7), (9)")
    snap_r = table("rxr")
    conn.execute("CREATE TABLE rxr_child (ref int REFERENCES rxr (id) ON DELETE RESTRICT)")
    snap_n = table("rxn")
    for t in ["rxc", "rxr", "rxn"]:
        swap_codes(conn, t)
    conn.execute("ALTER TABLE rxn ADD COLUMN note text DEFAULT 'kept'")
    conn.execute("UPDATE rxn SET note = 'changed' WHERE id IN (7, 9)")
    for t, s, why in [("rxc", snap, "run the action of foreign key rxc_child_ref_fkey of rxc_child"),
                      ("rxr", snap_r, "run the action of foreign key rxr_child_ref_fkey of rxr_child"),
                      ("rxn", snap_n, "lose their values of note, a column added since the snapshot")]:
        live = rows(conn, f"SELECT * FROM {t}")
        with pytest.raises(psycopg.errors.UniqueViolation) as e:
            conn.execute(f"SELECT * FROM gsnap_restore('{t}', {s})")
        assert e.value.diag.message_primary == (
            f"gsnap_restore of public.{t}: 1 row would take values of unique index "
            f"{t}_code_key that other rows it updates hold now"), e.value.diag.message_primary
        assert "exchanged values of (code) since snapshot" in e.value.diag.message_detail
        assert why in e.value.diag.message_detail, e.value.diag.message_detail
        assert "DEFERRABLE" in e.value.diag.message_hint
        assert rows(conn, f"SELECT * FROM {t}") == live
        notices.clear()
        assert restore(conn, f"'{t}', {s}, dry_run => true")[:2] == (0, 2)
        assert any(n.startswith(f"the restore would be refused: gsnap_restore of public.{t}: 1 row")
                   for n in notices), notices
    assert rows(conn, "SELECT * FROM rxc_child") == Counter([(7,), (9,)])


def test_triggers_are_off_by_default_and_fire_on_request(cluster, conn):
    conn.execute("CREATE TABLE rtr (id int PRIMARY KEY, v int) USING gsnap")
    conn.execute("CREATE TABLE rtr_log (op text, id int)")
    conn.execute("""CREATE FUNCTION rtr_audit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN INSERT INTO rtr_log VALUES (TG_OP, coalesce(NEW.id, OLD.id)); RETURN NULL; END $$""")
    conn.execute("CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON rtr "
                 "FOR EACH ROW EXECUTE FUNCTION rtr_audit()")
    conn.execute("CREATE TRIGGER audit_always AFTER INSERT ON rtr FOR EACH ROW EXECUTE FUNCTION rtr_audit()")
    conn.execute("ALTER TABLE rtr ENABLE ALWAYS TRIGGER audit_always")
    conn.execute("INSERT INTO rtr SELECT g, g FROM generate_series(1, 5) g")
    snap = snapshot(conn)
    conn.execute("DELETE FROM rtr WHERE id = 1")
    conn.execute("TRUNCATE rtr_log")
    assert restore(conn, f"'rtr', {snap}") == (0, 0, 1)
    assert conn.execute("SELECT count(*) FROM rtr_log").fetchone()[0] == 0
    # Back on afterwards, in the modes they had.
    modes = dict(conn.execute("SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = 'rtr'::regclass").fetchall())
    assert modes == {"audit": "O", "audit_always": "A"}
    conn.execute("DELETE FROM rtr WHERE id = 2")
    assert conn.execute("SELECT count(*) FROM rtr_log").fetchone()[0] == 1
    conn.execute("TRUNCATE rtr_log")
    assert restore(conn, f"'rtr', {snap}, triggers => true") == (0, 0, 1)
    assert sorted(conn.execute("SELECT op, id FROM rtr_log").fetchall()) == [("INSERT", 2), ("INSERT", 2)]
    # A role that may change the rows but does not own the table cannot turn them off.
    conn.execute("CREATE ROLE rtr_writer LOGIN")
    conn.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON rtr, rtr_log TO rtr_writer")
    conn.execute("DELETE FROM rtr WHERE id = 3")
    with cluster.connect(user="rtr_writer") as w:
        w.autocommit = True
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="ownership"):
            restore(w, f"'rtr', {snap}")
        assert restore(w, f"'rtr', {snap}, triggers => true") == (0, 0, 1)


def test_privileges_are_those_the_changes_need(cluster, conn):
    conn.execute("CREATE TABLE rpv (id int PRIMARY KEY, v int) USING gsnap")
    conn.execute("INSERT INTO rpv SELECT g, g FROM generate_series(1, 5) g")
    snap = snapshot(conn)
    conn.execute("UPDATE rpv SET v = 0")
    conn.execute("CREATE ROLE rpv_reader LOGIN")
    conn.execute("GRANT SELECT, INSERT ON rpv TO rpv_reader")
    with cluster.connect(user="rpv_reader") as r:
        r.autocommit = True
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
            restore(r, f"'rpv', {snap}")
        assert "UPDATE, DELETE" in e.value.diag.message_detail
        # Copying into a new table needs only SELECT (and CREATE on the schema).
        conn.execute("GRANT CREATE ON SCHEMA public TO rpv_reader")
        assert restore(r, f"'rpv', {snap}, into_table => 'rpv_copy'") == (0, 0, 5)
    conn.execute("REVOKE SELECT ON rpv FROM rpv_reader")
    with cluster.connect(user="rpv_reader") as r:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            restore(r, f"'rpv', {snap}, into_table => 'rpv_copy2'")
    assert conn.execute("SELECT sum(v) FROM rpv").fetchone()[0] == 0


def test_writers_wait_for_the_restore_and_repeatable_read_needs_the_lock_first(cluster, conn):
    conn.execute("CREATE TABLE rw (id int PRIMARY KEY, v int) USING gsnap")
    conn.execute("INSERT INTO rw SELECT g, 0 FROM generate_series(1, 20) g")
    snap = snapshot(conn)
    conn.execute("UPDATE rw SET v = 1")
    with cluster.connect(autocommit=False) as a, cluster.connect(autocommit=False) as b:
        a.execute("SELECT * FROM gsnap_restore('rw', %s)", (snap,))
        # Readers go on (they see the committed rows), writers wait.
        assert b.execute("SELECT sum(v) FROM rw").fetchone()[0] == 20
        b.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            b.execute("UPDATE rw SET v = 2 WHERE id = 1")
        b.rollback()
        a.commit()
        assert b.execute("SELECT sum(v) FROM rw").fetchone()[0] == 0
        b.rollback()
        # REPEATABLE READ: the transaction's snapshot predates the restore's lock.
        conn.execute("UPDATE rw SET v = 1")
        a.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="LOCK TABLE"):
            a.execute("SELECT * FROM gsnap_restore('rw', %s)", (snap,))
        a.rollback()
        a.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        a.execute("LOCK TABLE rw IN EXCLUSIVE MODE")
        assert a.execute("SELECT * FROM gsnap_restore('rw', %s)", (snap,)).fetchone() == (0, 20, 0)
        a.commit()
    assert conn.execute("SELECT sum(v) FROM rw").fetchone()[0] == 0


def test_a_snapshot_is_not_awaited_behind_a_session_this_transaction_blocks(cluster, conn):
    """A declaration (gsnap_snapshot(), or the snapshot a restore takes) waits for ACCESS
    SHARE on every gsnap table. If another session is queued for ACCESS EXCLUSIVE on a table
    this transaction has locked, the worker waits for that session, which waits for this
    transaction: an ERROR (55P03) at once, not a wait that only a timeout would end."""
    conn.execute("CREATE TABLE rq (id int PRIMARY KEY, v int) USING gsnap")
    conn.execute("INSERT INTO rq SELECT g, 0 FROM generate_series(1, 5000) g")  # many pages
    snap = snapshot(conn)
    conn.execute("UPDATE rq SET v = 1 WHERE id <= 20")  # a few: a restore takes a snapshot
    for call in ["SELECT gsnap_snapshot()", f"SELECT * FROM gsnap_restore('rq', {snap})"]:
        with cluster.connect(autocommit=False) as a, cluster.connect(autocommit=True) as b:
            a.execute("SET statement_timeout = '20s'")
            a.execute("SELECT count(*) FROM rq")  # ACCESS SHARE until the transaction ends
            done = threading.Event()

            def alter():
                b.execute("SET lock_timeout = '30s'")
                b.execute("ALTER TABLE rq ADD COLUMN w int")  # queued behind a's lock
                b.execute("ALTER TABLE rq DROP COLUMN w")
                done.set()

            waiter = threading.Thread(target=alter)
            waiter.start()
            deadline = time.time() + 10
            while not conn.execute("SELECT count(*) FROM pg_locks WHERE relation = 'rq'::regclass"
                                   " AND NOT granted").fetchone()[0]:
                assert time.time() < deadline
                time.sleep(0.05)
            t0 = time.time()
            with pytest.raises(psycopg.errors.LockNotAvailable, match="behind a lock this transaction holds"):
                a.execute(call)
            assert time.time() - t0 < 10, call
            a.rollback()
            waiter.join(10)
            assert done.is_set()
            # nothing is left behind: the worker says no declaration waits for the table (a
            # value left there would make the next declaration of a transaction holding a
            # lock on it give up), and one goes through
            deadline = time.time() + 10
            while conn.execute("SELECT waiting_for_table FROM gsnap_progress()").fetchone()[0] is not None:
                assert time.time() < deadline, "waiting_for_table left behind"
                time.sleep(0.1)
            a.execute("SELECT count(*) FROM rq")
            assert a.execute("SELECT gsnap_snapshot()").fetchone()[0] > snap
            a.rollback()
    # with the other session gone, the restore goes through
    assert restore(conn, f"'rq', {snap}") == (0, 20, 0)


def test_a_column_dropped_while_the_restore_waits_is_not_restored(cluster, conn):
    """gsnap_restore locks the table (ACCESS SHARE, as a SELECT would) before it reads its
    columns: a restore queued behind an ALTER TABLE reads the columns that ALTER left, and
    goes through, where it read them before the lock and then named a column gone."""
    conn.execute("CREATE TABLE rdc (id int PRIMARY KEY, v int, c text) USING gsnap")
    conn.execute("INSERT INTO rdc SELECT g, g, 'c' || g FROM generate_series(1, 200) g")
    snap = snapshot(conn)
    conn.execute("UPDATE rdc SET v = -v WHERE id <= 30")
    conn.execute("DELETE FROM rdc WHERE id > 190")
    with cluster.connect(autocommit=False) as alter, cluster.connect(autocommit=True) as r:
        alter.execute("ALTER TABLE rdc DROP COLUMN c")
        result = {}

        def run():
            try:
                result["counts"] = restore(r, f"'rdc', {snap}")
            except psycopg.Error as e:
                result["error"] = e

        t = threading.Thread(target=run)
        t.start()
        deadline = time.time() + 10
        while not conn.execute("SELECT count(*) FROM pg_locks WHERE relation = 'rdc'::regclass"
                               " AND NOT granted").fetchone()[0]:
            assert time.time() < deadline
            time.sleep(0.05)
        alter.commit()
        t.join(30)
    assert "error" not in result, result
    assert result["counts"] == (0, 30, 10)
    assert rows(conn, "SELECT * FROM rdc") == rows(conn, f"SELECT * FROM gsnap_asof(NULL::rdc, {snap})")
    assert conn.execute("SELECT count(*) FROM rdc WHERE v < 0").fetchone()[0] == 0


def test_identity_and_generated_columns_are_restored(conn):
    conn.execute("CREATE TABLE rg (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v int, "
                 "d int GENERATED ALWAYS AS (v * 10) STORED) USING gsnap")
    conn.execute("INSERT INTO rg (v) SELECT g FROM generate_series(1, 10) g")
    snap = snapshot(conn)
    conn.execute("DELETE FROM rg WHERE id <= 3")
    conn.execute("UPDATE rg SET v = 0 WHERE id = 4")
    conn.execute("INSERT INTO rg (v) VALUES (99)")
    assert restored(conn, "rg", snap) == (1, 1, 3)


def test_sequences_are_advanced_past_the_restored_values(cluster, conn):
    """A restore after `TRUNCATE ... RESTART IDENTITY` (or a sequence restarted) puts back
    rows whose keys the sequence would give again: the sequence owned by the column (serial,
    identity, OWNED BY; ascending or descending) is advanced past them, with a NOTICE, so
    the next insert does not collide. A sequence already past them, or a column not owned
    by one, is left alone; a caller who may not change the sequence is warned with the
    statement to run; gsnap_restore_tables advances each table's."""
    notices = []
    conn.add_notice_handler(lambda d: notices.append((d.severity, d.message_primary, d.message_hint)))
    conn.execute("CREATE TABLE rsq (id serial PRIMARY KEY, v text) USING gsnap")
    conn.execute("INSERT INTO rsq (v) SELECT 'v' || g FROM generate_series(1, 100) g")
    conn.execute("CREATE TABLE rsi (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                 "n int GENERATED BY DEFAULT AS IDENTITY (START 500), v int) USING gsnap")
    conn.execute("INSERT INTO rsi (v) SELECT g FROM generate_series(1, 50) g")
    conn.execute("CREATE SEQUENCE rsd_seq INCREMENT BY -1 MAXVALUE -1 START -1")
    conn.execute("CREATE TABLE rsd (id int PRIMARY KEY DEFAULT nextval('rsd_seq'), v int) USING gsnap")
    conn.execute("ALTER SEQUENCE rsd_seq OWNED BY rsd.id")
    conn.execute("INSERT INTO rsd (v) SELECT g FROM generate_series(1, 10) g")
    snap = snapshot(conn)
    # The bad deploy: emptied and restarted, then new rows with reused keys.
    conn.execute("TRUNCATE rsq RESTART IDENTITY")
    conn.execute("INSERT INTO rsq (v) VALUES ('new 1'), ('new 2')")
    conn.execute("ALTER TABLE rsi ALTER COLUMN id RESTART, ALTER COLUMN n RESTART")
    conn.execute("DELETE FROM rsi WHERE id > 40")
    conn.execute("ALTER SEQUENCE rsd_seq RESTART")
    conn.execute("DELETE FROM rsd WHERE id < -5")
    notices.clear()
    assert restored(conn, "rsq", snap) == (0, 2, 98)
    assert [n for n in notices if n[1].startswith("sequence")] == [
        ("NOTICE", "sequence rsq_id_seq advanced to 100, the greatest value of public.rsq.id restored", None)]
    assert conn.execute("INSERT INTO rsq (v) VALUES ('after') RETURNING id").fetchone()[0] == 101
    notices.clear()
    assert conn.execute("SELECT * FROM gsnap_restore_tables(ARRAY['rsi', 'rsd'], %s)", (snap,)).fetchall() == [
        ("public.rsi", 0, 0, 10), ("public.rsd", 0, 0, 5)]
    advanced = sorted(n[1] for n in notices if n[1].startswith("sequence"))
    assert advanced == [
        "sequence rsd_seq advanced to -10, the least value of public.rsd.id restored",
        "sequence rsi_id_seq advanced to 50, the greatest value of public.rsi.id restored",
        "sequence rsi_n_seq advanced to 549, the greatest value of public.rsi.n restored"], notices
    assert conn.execute("INSERT INTO rsi (v) VALUES (0) RETURNING id, n").fetchone() == (51, 550)
    assert conn.execute("INSERT INTO rsd (v) VALUES (0) RETURNING id").fetchone()[0] == -11
    # A copy into a new table: its identity columns' own sequences (LIKE made them anew)
    # continue after the rows copied.
    notices.clear()
    assert restore(conn, f"'rsi', {snap}, into_table => 'rsi_copy'") == (0, 0, 50)
    assert len([n for n in notices if n[1].startswith("sequence")]) == 2, notices
    assert conn.execute("INSERT INTO rsi_copy (v) VALUES (0) RETURNING id, n").fetchone() == (51, 550)
    # Already past the restored values (rows deleted, not restarted): left alone, no NOTICE.
    snap2 = snapshot(conn)
    conn.execute("DELETE FROM rsq WHERE id > 50")
    conn.execute("INSERT INTO rsq (v) VALUES ('later')")
    notices.clear()
    restored(conn, "rsq", snap2)
    assert not [n for n in notices if n[1].startswith("sequence")]
    assert conn.execute("INSERT INTO rsq (v) VALUES ('next') RETURNING id").fetchone()[0] == 103
    # A role that may write the table and use the sequence, not set it: warned, restored.
    conn.execute("TRUNCATE rsq RESTART IDENTITY")
    conn.execute("CREATE ROLE rsq_writer LOGIN")
    conn.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON rsq TO rsq_writer")
    conn.execute("GRANT USAGE ON SEQUENCE rsq_id_seq TO rsq_writer")
    with cluster.connect(user="rsq_writer") as w:
        w.autocommit = True
        warned = []
        w.add_notice_handler(lambda d: warned.append((d.severity, d.message_primary, d.message_hint)))
        assert restore(w, f"'rsq', {snap2}")[2] == 101
        [(severity, message, hint)] = [n for n in warned if n[1].startswith("sequence")]
        assert severity == "WARNING" and "rsq_id_seq" in message, warned
        assert hint.startswith("Its owner can run SELECT setval('rsq_id_seq', (SELECT max(id) FROM public.rsq))")
    assert conn.execute("SELECT last_value, is_called FROM rsq_id_seq").fetchone() == (1, False)
    conn.execute("SELECT setval('rsq_id_seq', (SELECT max(id) FROM public.rsq))")
    assert conn.execute("INSERT INTO rsq (v) VALUES ('x') RETURNING id").fetchone()[0] == 102


def test_a_dry_run_names_the_sequences_a_restore_would_advance(conn):
    """The dry run says which sequences the restore would advance, and to what (from what the
    table would hold: the snapshot's rows the condition matches and the live rows it does
    not), and moves none. A partition restored alone advances its partitioned table's
    sequence, which gives its rows their values."""
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))

    def run(args: str) -> tuple:
        """The restore's counts, and its NOTICEs about sequences."""
        notices.clear()
        return restore(conn, args), sorted(n for n in notices if n.startswith("sequence"))

    would = "sequence {} would be advanced to {}, the greatest value of {} the restore would put back"
    conn.execute("CREATE TABLE rdq (id serial PRIMARY KEY, grp int) USING gsnap")
    conn.execute("INSERT INTO rdq (grp) SELECT g % 2 FROM generate_series(1, 60) g")
    snap = snapshot(conn)
    conn.execute("DELETE FROM rdq WHERE id > 20")
    conn.execute("SELECT setval('rdq_id_seq', 20)")
    assert run(f"'rdq', {snap}, dry_run => true") == (
        (0, 0, 40), [would.format("rdq_id_seq", 60, "public.rdq.id")])
    assert conn.execute("SELECT last_value FROM rdq_id_seq").fetchone()[0] == 20
    assert conn.execute("SELECT count(*) FROM rdq").fetchone()[0] == 20
    # With a condition: the odd group's rows come back (up to 59); the even ones stay deleted.
    odd = f"'rdq', {snap}, condition => 'grp = 1'"
    assert run(odd + ", dry_run => true") == ((0, 0, 20), [would.format("rdq_id_seq", 59, "public.rdq.id")])
    # Rows the condition leaves alone count too: the live 500 is beyond the sequence already
    # (a restore moves sequences forward only to pass every value the table then holds).
    conn.execute("INSERT INTO rdq VALUES (500, 0)")
    assert run(odd + ", dry_run => true")[1] == [would.format("rdq_id_seq", 500, "public.rdq.id")]
    # The restore then does what its dry run said, and a dry run after it has nothing to say.
    assert run(odd) == ((0, 0, 20), ["sequence rdq_id_seq advanced to 500, the greatest value of "
                                     "public.rdq.id restored"])
    assert run(odd + ", dry_run => true")[1] == []
    # A partition's rows take their ids from the partitioned table's sequence.
    conn.execute("CREATE TABLE rdp (id bigserial, region int, PRIMARY KEY (id, region)) "
                 "PARTITION BY LIST (region)")
    conn.execute("CREATE TABLE rdp_1 PARTITION OF rdp FOR VALUES IN (1) USING gsnap")
    conn.execute("CREATE TABLE rdp_2 (region int NOT NULL, id bigint NOT NULL) USING gsnap")
    conn.execute("ALTER TABLE rdp ATTACH PARTITION rdp_2 FOR VALUES IN (2)")  # other attnums
    conn.execute("INSERT INTO rdp (region) SELECT 1 + g % 2 FROM generate_series(1, 30) g")
    snap = snapshot(conn)
    conn.execute("TRUNCATE rdp")
    conn.execute("ALTER SEQUENCE rdp_id_seq RESTART")
    assert run(f"'rdp_2', {snap}, dry_run => true") == (
        (0, 0, 15), [would.format("rdp_id_seq", 29, "public.rdp_2.id")])
    assert run(f"'rdp_2', {snap}") == ((0, 0, 15), ["sequence rdp_id_seq advanced to 29, the greatest "
                                                     "value of public.rdp_2.id restored"])
    assert rows(conn, "SELECT * FROM ONLY rdp_2") == rows(conn, f"SELECT * FROM gsnap_asof(NULL::rdp_2, {snap})")
    assert conn.execute("INSERT INTO rdp (region) VALUES (1) RETURNING id").fetchone()[0] == 30


def test_bad_input_is_refused_clearly(conn):
    conn.execute("CREATE TABLE rb (id int PRIMARY KEY) USING gsnap")
    conn.execute("CREATE TABLE rb_parted (id int) PARTITION BY RANGE (id)")
    conn.execute("CREATE TABLE rb_parted_heap PARTITION OF rb_parted FOR VALUES FROM (0) TO (10)")
    conn.execute("CREATE VIEW rb_view AS SELECT 1 AS x")
    snap = snapshot(conn)
    for call, error in [
        (f"NULL, {snap}", psycopg.errors.NullValueNotAllowed),
        ("'rb', NULL::bigint", psycopg.errors.NullValueNotAllowed),
        (f"'rb_parted', {snap}", psycopg.errors.FeatureNotSupported),
        (f"'rb_view', {snap}", psycopg.errors.WrongObjectType),
        (f"'rb', {snap}, condition => 'id ='", psycopg.errors.SyntaxError),
        (f"'rb', {snap}, condition => 'nope > 1'", psycopg.errors.UndefinedColumn),
        (f"'rb', {snap}, into_table => ''", psycopg.errors.InvalidParameterValue),
    ]:
        with pytest.raises(error):
            restore(conn, call)
    with pytest.raises(psycopg.Error) as e:
        restore(conn, "'rb', 999999")
    assert "999999" in str(e.value)


def test_odd_arguments_give_rows_or_a_clean_error(cluster, conn):
    """Every kind of relation, odd snapshot ids and times, odd conditions and target names,
    each call in a transaction rolled back: rows or a clean ERROR (an SQLSTATE that is not
    XX000 internal), and the server stays up."""
    conn.execute("CREATE TABLE ro (id int PRIMARY KEY, v text) USING gsnap")
    conn.execute("INSERT INTO ro SELECT g, 'v' || g FROM generate_series(1, 20) g")
    conn.execute("CREATE TABLE ro_heap (id int) USING heap")
    conn.execute("CREATE TABLE ro_parted (id int) PARTITION BY RANGE (id)")
    conn.execute("CREATE TABLE ro_part PARTITION OF ro_parted FOR VALUES FROM (0) TO (100)")
    conn.execute("CREATE VIEW ro_view AS SELECT * FROM ro")
    conn.execute("CREATE MATERIALIZED VIEW ro_mat AS SELECT * FROM ro")
    conn.execute("CREATE SEQUENCE ro_seq")
    conn.execute("CREATE TYPE ro_type AS (a int)")
    conn.execute("CREATE UNLOGGED TABLE ro_unlogged (id int) USING gsnap")
    conn.execute("CREATE TABLE ro_dropped (id int) USING gsnap")
    dropped = conn.execute("SELECT 'ro_dropped'::regclass::oid").fetchone()[0]
    snap = snapshot(conn)
    conn.execute("DROP TABLE ro_dropped")
    conn.execute("UPDATE ro SET v = 'changed'")
    toast = conn.execute("SELECT reltoastrelid FROM pg_class WHERE relname = 'ro'").fetchone()[0]
    started = conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
    rels = ["'ro'", "'ro_heap'", "'ro_parted'", "'ro_part'", "'ro_view'", "'ro_mat'", "'ro_seq'",
            "'ro_pkey'", "'ro_unlogged'", "'pg_class'", f"{dropped}::oid", f"{toast}::oid", "0::oid",
            "'ro_type'"]
    snaps = [str(snap), "0", "-1", "9223372036854775807", str(snap + 1000), "NULL::bigint",
             "'infinity'::timestamptz", "'-infinity'::timestamptz", "now()", "NULL::timestamptz"]
    extras = ["", ", condition => NULL", ", condition => ''", ", condition => 'true) OR (true'",
              ", condition => 'id / 0 = 1'", ", condition => 'v'", ", into_table => NULL",
              ", into_table => 'a.b.c.d'", ", into_table => 'pg_catalog.ro_x'", ", into_table => '\"\"'",
              ", triggers => NULL"]
    calls = [("gsnap_restore", f"{r}, {s}") for r in rels for s in snaps]
    calls += [("gsnap_restore", f"'ro', {snap}{e}") for e in extras]
    # Several tables at once: each odd table with a good one, names that are no tables.
    names = [r for r in rels if r.startswith("'")] + ["'ro_nosuch'", "'\"ro'", "'a.b.c.d'", "''",
                                                      "NULL", f"'{dropped}'"]
    calls += [("gsnap_restore_tables", f"ARRAY['ro', {n}], {s}") for n in names for s in snaps[:6]]
    calls += [("gsnap_restore_tables", f"ARRAY['ro'], {snap}{e}") for e in (", triggers => NULL", "")]
    outcomes = Counter()
    for fn, call in calls:
        conn.execute("BEGIN")
        try:
            conn.execute(f"SELECT * FROM {fn}({call})").fetchall()
            outcomes["rows"] += 1
        except psycopg.Error as e:
            assert e.sqlstate and e.sqlstate != "XX000", f"{fn}({call}): {e.sqlstate} {e}"
            outcomes[e.sqlstate] += 1
        finally:
            conn.execute("ROLLBACK")
    assert conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0] == started
    assert outcomes["rows"] >= 3, outcomes
    assert conn.execute("SELECT count(*) FROM ro WHERE v = 'changed'").fetchone()[0] == 20


def test_a_key_added_since_the_snapshot_is_checked_against_its_rows(conn):
    """The whole comparison finds the live rows to delete with an anti join, skipped when the
    counts say there are none and the table had the same primary key at the snapshot (its
    rows then had distinct keys). A key added or changed since: the anti join always runs,
    and a snapshot holding rows with equal keys (which the table could not hold again) is
    refused with 23505, the table unchanged."""
    conn.execute("CREATE TABLE rdup (id int, v text) USING gsnap")
    conn.execute("INSERT INTO rdup SELECT g, 'v' || g FROM generate_series(1, 40) g")
    conn.execute("INSERT INTO rdup VALUES (7, 'again')")
    dup = snapshot(conn)
    conn.execute("DELETE FROM rdup WHERE v = 'again'")
    unique = snapshot(conn)
    conn.execute("ALTER TABLE rdup ADD PRIMARY KEY (id)")
    conn.execute("UPDATE rdup SET v = 'changed' WHERE id % 4 = 0")
    conn.execute("DELETE FROM rdup WHERE id IN (3, 30)")
    conn.execute("INSERT INTO rdup VALUES (100, 'new'), (101, 'new')")
    live = rows(conn, "SELECT * FROM rdup")
    # The live rows without a key at the snapshot (100 and 101) number one more than the
    # counts say (the snapshot's two rows with key 7 match one live row), as many, one fewer.
    for extra in ["", "DELETE FROM rdup WHERE id = 101", "DELETE FROM rdup WHERE id > 99"]:
        conn.execute("BEGIN")
        if extra:
            conn.execute(extra)
        with pytest.raises(psycopg.errors.UniqueViolation) as e:
            restore(conn, f"'rdup', {dup}")
        assert "equal primary keys" in str(e.value)
        conn.execute("ROLLBACK")
    assert rows(conn, "SELECT * FROM rdup") == live
    # Distinct keys at the snapshot, the key added since: restored exactly.
    assert restored(conn, "rdup", unique) == (2, 10, 2)
    # The same key since the snapshot, under another name now: restored exactly too.
    keyed = snapshot(conn)
    conn.execute("ALTER TABLE rdup RENAME COLUMN id TO ident")
    conn.execute("UPDATE rdup SET v = 'again' WHERE ident % 5 = 0")
    conn.execute("DELETE FROM rdup WHERE ident = 11")
    conn.execute("INSERT INTO rdup VALUES (200, 'new')")
    assert restored(conn, "rdup", keyed) == (1, 8, 1)


def test_columns_named_like_the_diffs_own_columns_are_restored(conn):
    """The diff's temporary table has three columns of its own beside the table's; a table
    with columns of those names (and of the names they had before) is restored exactly."""
    conn.execute("CREATE TABLE rnames (gsnap_op int PRIMARY KEY, gsnap_tid text, gsnap_toid int, "
                 "gsnap__op int, op text, tid tid, toid oid, r int) USING gsnap")
    conn.execute("INSERT INTO rnames SELECT g, 't' || g, g, g, 'o', '(0,1)', 1, g "
                 "FROM generate_series(1, 50) g")
    snap = snapshot(conn)
    conn.execute("UPDATE rnames SET gsnap_tid = 'x', r = -r WHERE gsnap_op % 3 = 0")
    conn.execute("DELETE FROM rnames WHERE gsnap_op > 45")
    conn.execute("INSERT INTO rnames (gsnap_op, op) VALUES (99, 'new')")
    want = rows(conn, f"SELECT * FROM gsnap_asof(NULL::rnames, {snap})")
    assert restore(conn, f"'rnames', {snap}, condition => 'gsnap_op > 0'") == (1, 15, 5)
    assert rows(conn, "SELECT * FROM rnames") == want
    conn.execute("UPDATE rnames SET op = 'again' WHERE gsnap_op < 20")
    conn.execute("DELETE FROM rnames WHERE gsnap_op = 1")
    assert restore(conn, f"'rnames', {snap}") == (0, 18, 1)
    assert rows(conn, "SELECT * FROM rnames") == want


def test_the_restore_leaves_the_callers_planner_settings(conn):
    """The restore changes rows by TID in a nested loop over its diff, with hash and merge
    joins off for that one statement: the caller's settings are back after it, and after an
    ERROR raised inside it (rolled back to a savepoint)."""
    conn.execute("CREATE TABLE rset (id int PRIMARY KEY, v int) USING gsnap")
    conn.execute("INSERT INTO rset SELECT g, g FROM generate_series(1, 500) g")
    snap = snapshot(conn)
    conn.execute("UPDATE rset SET v = -v WHERE id % 2 = 0")

    def settings() -> tuple:
        return conn.execute("SELECT current_setting('enable_hashjoin'), "
                            "current_setting('enable_mergejoin'), current_setting('work_mem'), "
                            "current_setting('jit')").fetchone()

    conn.execute("SET work_mem = '1MB'")
    conn.execute("SET jit = on")
    for value in ["off", "on"]:
        conn.execute(f"SET enable_hashjoin = {value}")
        conn.execute("BEGIN")
        assert restore(conn, f"'rset', {snap}") == (0, 250, 0)
        assert settings() == (value, "on", "1MB", "on")
        assert conn.execute("SELECT count(*) FROM rset WHERE v < 0").fetchone()[0] == 0
        conn.execute("ROLLBACK")
    def fails_then_settings_are_back(call: str, error: type) -> None:
        conn.execute("BEGIN")
        conn.execute("SAVEPOINT a")
        with pytest.raises(error):
            restore(conn, call)
        conn.execute("ROLLBACK TO a")
        assert settings() == ("on", "on", "1MB", "on")
        conn.execute("ROLLBACK")
        assert settings() == ("on", "on", "1MB", "on")

    # An ERROR while the diff is written (with work_mem raised for it), rolled back to a
    # savepoint, leaves the settings too; so does one raised by a trigger during the UPDATE.
    fails_then_settings_are_back(f"'rset', {snap}, condition => 'id / (id - id) = 1'",
                                 psycopg.errors.DivisionByZero)
    conn.execute("CREATE FUNCTION rset_no() RETURNS trigger LANGUAGE plpgsql "
                 "AS $$BEGIN RAISE EXCEPTION 'no updates of rset'; END$$")
    conn.execute("CREATE TRIGGER rset_no BEFORE UPDATE ON rset FOR EACH ROW EXECUTE FUNCTION rset_no()")
    fails_then_settings_are_back(f"'rset', {snap}, triggers => true", psycopg.errors.RaiseException)


def test_row_security_keeps_the_whole_comparison_under_the_policies(cluster, conn):
    """A role that row-level security applies to restores through gsnap_asof, which applies
    the policies to the old rows (the diff of two snapshots is read by a function scan, which
    cannot): only the rows it may see, old and new, are compared and changed."""
    conn.execute("CREATE TABLE rrls (id int PRIMARY KEY, who text, v int) USING gsnap")
    conn.execute("INSERT INTO rrls SELECT g, CASE WHEN g % 2 = 0 THEN 'rrls_user' ELSE 'other' END, g "
                 "FROM generate_series(1, 100) g")
    conn.execute("ALTER TABLE rrls ENABLE ROW LEVEL SECURITY")
    conn.execute("CREATE POLICY mine ON rrls USING (who = current_user)")
    conn.execute("CREATE ROLE rrls_user LOGIN IN ROLE gsnap_admin")
    conn.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON rrls TO rrls_user")
    snap = snapshot(conn)
    conn.execute("UPDATE rrls SET v = -v")
    with cluster.connect(user="rrls_user") as r:
        r.autocommit = True
        notices: list[str] = []
        r.add_notice_handler(lambda d: notices.append(d.message_primary))
        assert restore(r, f"'rrls', {snap}") == (0, 50, 0)
        assert not any("took snapshot" in n for n in notices), notices
    assert conn.execute("SELECT count(*) FILTER (WHERE v < 0 AND who = 'other'), "
                        "count(*) FILTER (WHERE v > 0 AND who = 'rrls_user') FROM rrls").fetchone() == (50, 50)


def test_a_table_whose_columns_are_all_key_or_generated_is_restored(conn):
    """A stored generated column added since the snapshot reads as NULL there, so every kept
    row differs from the snapshot's in it; with no other column than the key there is nothing
    to update (the column is computed again), and the restore deletes and inserts only."""
    conn.execute("CREATE TABLE rkg (id int PRIMARY KEY) USING gsnap")
    conn.execute("INSERT INTO rkg SELECT generate_series(1, 30)")
    snap = snapshot(conn)
    conn.execute("ALTER TABLE rkg ADD COLUMN g int GENERATED ALWAYS AS (id * 2) STORED")
    conn.execute("DELETE FROM rkg WHERE id IN (4, 5)")
    conn.execute("INSERT INTO rkg VALUES (31)")
    assert restore(conn, f"'rkg', {snap}") == (1, 0, 2)
    assert rows(conn, "SELECT id, g FROM rkg") == rows(conn, "SELECT g, g * 2 FROM generate_series(1, 30) g")


def test_columns_added_since_the_snapshot_keep_their_values_or_take_their_defaults(cluster, conn):
    """The undone deploy: a migration added columns (NOT NULL with a default, a default, an
    identity key) and then changed rows. The snapshot has no value for those columns, so the
    restore compares and writes the columns it has: a row updated back keeps its value of an
    added column, a row put back takes the column's default, a row that differs only there is
    left alone, and a second restore changes nothing. A NOTICE names the columns."""
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    conn.execute("CREATE TABLE rdeploy (id int PRIMARY KEY, name text, price int) USING gsnap")
    conn.execute("INSERT INTO rdeploy SELECT g, 'n' || g, g FROM generate_series(1, 100) g")
    snap = snapshot(conn)
    conn.execute("ALTER TABLE rdeploy ADD COLUMN active bool NOT NULL DEFAULT true")
    conn.execute("ALTER TABLE rdeploy ADD COLUMN note text DEFAULT 'migrated'")
    conn.execute("UPDATE rdeploy SET price = price * 100, active = false WHERE id % 10 = 0")
    conn.execute("UPDATE rdeploy SET note = 'only this changed' WHERE id = 7")
    conn.execute("DELETE FROM rdeploy WHERE id > 95")
    conn.execute("INSERT INTO rdeploy VALUES (200, 'new', 1, false, 'x')")
    before = {r[0]: r for r in conn.execute("SELECT * FROM rdeploy")}
    assert restore(conn, f"'rdeploy', {snap}") == (1, 9, 5)
    assert any("columns active, note were added to public.rdeploy after snapshot" in n for n in notices), notices
    # The snapshot's columns are the snapshot's rows.
    assert rows(conn, "SELECT id, name, price FROM rdeploy") == \
        rows(conn, f"SELECT id, name, price FROM gsnap_asof(NULL::rdeploy, {snap})")
    after = {r[0]: r for r in conn.execute("SELECT * FROM rdeploy")}
    for i in range(1, 96):  # kept or updated back: the added columns as they were
        assert after[i][3:] == before[i][3:], i
    for i in range(96, 101):  # put back: the defaults
        assert after[i][3:] == (True, "migrated"), i
    assert after[7][4] == "only this changed"
    assert restore(conn, f"'rdeploy', {snap}") == (0, 0, 0)
    # The same through a condition, and into a new table (NOT NULL kept by LIKE: the default).
    conn.execute("UPDATE rdeploy SET name = 'again', active = false WHERE id IN (1, 2)")
    assert restore(conn, f"'rdeploy', {snap}, condition => 'id = 1'") == (0, 1, 0)
    assert conn.execute("SELECT id, name, active FROM rdeploy WHERE id IN (1, 2) ORDER BY 1").fetchall() == \
        [(1, "n1", False), (2, "again", False)]
    assert restore(conn, f"'rdeploy', {snap}, into_table => 'rdeploy_copy'") == (0, 0, 100)
    assert conn.execute("SELECT count(*) FILTER (WHERE active AND note = 'migrated') FROM rdeploy_copy").fetchone()[0] == 100
    # A column dropped since: its values are read back in the snapshot's columns (the
    # README's recipe for a deploy that dropped one).
    conn.execute("CREATE TABLE rdropped (id int PRIMARY KEY, note text, keep int) USING gsnap")
    conn.execute("INSERT INTO rdropped SELECT g, 'note ' || g, g FROM generate_series(1, 20) g")
    snap_d = snapshot(conn)
    conn.execute("ALTER TABLE rdropped DROP COLUMN note")
    conn.execute("ALTER TABLE rdropped ADD COLUMN note text")
    conn.execute(f"UPDATE rdropped a SET note = o.note FROM gsnap_asof_dropped('public.rdropped', {snap_d}) "
                 "AS o(id int, note text, keep int) WHERE a.id = o.id")
    assert rows(conn, "SELECT id, note FROM rdropped") == rows(conn, "SELECT g, 'note ' || g FROM generate_series(1, 20) g")
    # A column dropped and added again under the same name is a new column (a new attribute).
    snap2 = snapshot(conn)
    conn.execute("ALTER TABLE rdeploy DROP COLUMN name")
    conn.execute("ALTER TABLE rdeploy ADD COLUMN name text DEFAULT 'fresh'")
    conn.execute("DELETE FROM rdeploy WHERE id = 3")
    notices.clear()
    assert restore(conn, f"'rdeploy', {snap2}") == (0, 0, 1)
    assert any("column name was added" in n for n in notices), notices
    assert conn.execute("SELECT name FROM rdeploy WHERE id = 3").fetchone()[0] == "fresh"
    # A NOT NULL column without a default: a row put back is PostgreSQL's own error, named.
    conn.execute("ALTER TABLE rdeploy ADD COLUMN required int")
    conn.execute("UPDATE rdeploy SET required = 1")
    conn.execute("ALTER TABLE rdeploy ALTER COLUMN required SET NOT NULL")
    conn.execute("DELETE FROM rdeploy WHERE id = 4")
    with pytest.raises(psycopg.errors.NotNullViolation) as e:
        restore(conn, f"'rdeploy', {snap2}")
    assert "required" in str(e.value)
    # No key at the snapshot, an identity key added since: rows are matched by the
    # snapshot's columns (as multisets), and the rows put back get new key values.
    conn.execute("CREATE TABLE rnokey (a int, b text) USING gsnap")
    conn.execute("INSERT INTO rnokey VALUES (1, 'x'), (1, 'x'), (2, 'y'), (3, 'z')")
    snap3 = snapshot(conn)
    conn.execute("ALTER TABLE rnokey ADD COLUMN id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY")
    conn.execute("DELETE FROM rnokey WHERE b = 'y'")
    conn.execute("UPDATE rnokey SET b = 'changed' WHERE id = 1")
    kept = conn.execute("SELECT id FROM rnokey WHERE a = 3").fetchone()[0]
    assert restore(conn, f"'rnokey', {snap3}") == (1, 0, 2)
    assert rows(conn, "SELECT a, b FROM rnokey") == rows(conn, f"SELECT a, b FROM gsnap_asof(NULL::rnokey, {snap3})")
    assert conn.execute("SELECT id FROM rnokey WHERE a = 3").fetchone()[0] == kept
    assert conn.execute("SELECT count(DISTINCT id) FROM rnokey").fetchone()[0] == 4


def test_a_partitioned_table_with_a_column_added_since_keeps_it(conn):
    """The same for a partitioned table: a column added to it since the snapshot is in no
    partition's recorded columns."""
    conn.execute("CREATE TABLE rpadd (id int, region text, v int, PRIMARY KEY (id, region)) "
                 "PARTITION BY LIST (region)")
    conn.execute("CREATE TABLE rpadd_eu PARTITION OF rpadd FOR VALUES IN ('eu') USING gsnap")
    conn.execute("CREATE TABLE rpadd_us PARTITION OF rpadd FOR VALUES IN ('us') USING gsnap")
    conn.execute("INSERT INTO rpadd SELECT g, (ARRAY['eu','us'])[1 + g % 2], g FROM generate_series(1, 60) g")
    snap = snapshot(conn)
    conn.execute("ALTER TABLE rpadd ADD COLUMN flag int NOT NULL DEFAULT 7")
    conn.execute("UPDATE rpadd SET v = -v, flag = 8 WHERE id % 6 = 0")
    conn.execute("DELETE FROM rpadd WHERE id IN (1, 2)")
    assert restore(conn, f"'rpadd', {snap}") == (0, 10, 2)
    assert rows(conn, "SELECT id, region, v FROM rpadd") == \
        rows(conn, f"SELECT id, region, v FROM gsnap_asof(NULL::rpadd, {snap})")
    assert rows(conn, "SELECT flag, count(*) FROM rpadd GROUP BY 1") == Counter({(7, 50): 1, (8, 10): 1})


def restore_tables(conn, call: str) -> dict:
    """gsnap_restore_tables: {table: (deleted, updated, inserted)}."""
    return {r[0]: tuple(r[1:]) for r in conn.execute(f"SELECT * FROM gsnap_restore_tables({call})")}


def test_parents_and_children_are_restored_together(cluster, conn):
    """A deploy changed orders and their lines both ways: lines moved to an order added since,
    orders deleted with their lines, contents changed. Neither table can be restored alone,
    in either order (a NO ACTION foreign key refuses each), but gsnap_restore_tables changes
    both in one statement and the keys are checked once every row is back; with the snapshot
    the restore takes of both tables, and by comparing whole tables in a transaction that
    wrote; by id, label and time; all or nothing; idempotent."""
    conn.execute("CREATE TABLE ord (id int PRIMARY KEY, customer text) USING gsnap")
    conn.execute("CREATE TABLE ord_line (id int PRIMARY KEY, ord int NOT NULL REFERENCES ord, qty int) USING gsnap")
    conn.execute("CREATE TABLE ord_log (n int)")
    conn.execute("CREATE FUNCTION ord_log() RETURNS trigger LANGUAGE plpgsql AS "
                 "$$BEGIN INSERT INTO ord_log VALUES (1); RETURN NULL; END$$")
    conn.execute("CREATE TRIGGER ord_line_log AFTER INSERT OR UPDATE OR DELETE ON ord_line "
                 "FOR EACH ROW EXECUTE FUNCTION ord_log()")
    conn.execute("INSERT INTO ord SELECT g, 'c' || g FROM generate_series(1, 5000) g")
    conn.execute("INSERT INTO ord_line SELECT g, (g - 1) / 4 + 1, g FROM generate_series(1, 20000) g")
    conn.execute("TRUNCATE ord_log")
    snap = conn.execute("SELECT gsnap_snapshot(label => 'ord before the deploy')").fetchone()[0]
    want = {t: rows(conn, f"SELECT * FROM gsnap_asof(NULL::{t}, {snap})") for t in ("ord", "ord_line")}

    def deploy():
        conn.execute("INSERT INTO ord VALUES (10000, 'new'), (10001, 'new')")
        conn.execute("UPDATE ord_line SET ord = 10000 WHERE ord = 10")  # lines moved to a new order
        conn.execute("DELETE FROM ord_line WHERE ord IN (1, 2, 3)")
        conn.execute("DELETE FROM ord WHERE id IN (1, 2, 3, 10)")  # orders gone with their lines
        conn.execute("INSERT INTO ord_line VALUES (50000, 10001, 1)")
        conn.execute("UPDATE ord SET customer = 'renamed' WHERE id BETWEEN 20 AND 29")
        conn.execute("UPDATE ord_line SET qty = -qty WHERE id BETWEEN 101 AND 124")
        conn.execute("TRUNCATE ord_log")  # what the deploy's changes logged

    deploy()
    live = {t: rows(conn, f"SELECT * FROM {t}") for t in ("ord", "ord_line")}
    # Alone, in either order: refused by the foreign key, nothing changed.
    for first in ("ord", "ord_line"):
        conn.execute("BEGIN")
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            restore(conn, f"'{first}', {snap}")
        conn.execute("ROLLBACK")
    assert {t: rows(conn, f"SELECT * FROM {t}") for t in live} == live
    # Together (few pages changed: the restore takes one snapshot of both, the undo point,
    # and reads the rows that changed since).
    before = conn.execute("SELECT count(*) FROM gsnap_snapshots()").fetchone()[0]
    got = restore_tables(conn, f"ARRAY['ord', 'ord_line'], {snap}")
    assert got == {"public.ord": (2, 10, 4), "public.ord_line": (1, 28, 12)}, got
    assert conn.execute("SELECT count(*) FROM gsnap_snapshots()").fetchone()[0] == before + 1
    assert {t: rows(conn, f"SELECT * FROM {t}") for t in want} == want
    assert conn.execute("SELECT count(*) FROM ord_log").fetchone()[0] == 0  # triggers off
    assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'ord_line_log' "
                        "AND tgenabled = 'O'").fetchone()[0] == 1  # and back on
    # Again: nothing to change.
    assert restore_tables(conn, f"ARRAY['ord_line', 'ord'], {snap}") == {
        "public.ord_line": (0, 0, 0), "public.ord": (0, 0, 0)}
    # The same deploy again, restored by label in a transaction that already wrote (whole
    # tables compared, no snapshot taken), the tables named the other way round.
    deploy()
    conn.execute("BEGIN")
    conn.execute("INSERT INTO ord_log VALUES (0)")
    got = restore_tables(conn, "'{ord_line,ord}', 'ord before the deploy', triggers => true")
    assert got == {"public.ord_line": (1, 28, 12), "public.ord": (2, 10, 4)}, got
    assert {t: rows(conn, f"SELECT * FROM {t}") for t in want} == want
    assert conn.execute("SELECT count(*) FROM ord_log").fetchone()[0] == 1 + 1 + 28 + 12
    conn.execute("ROLLBACK")  # all or nothing
    assert {t: rows(conn, f"SELECT * FROM {t}") for t in live} == live
    # By time.
    taken_at = conn.execute("SELECT taken_at FROM gsnap_snapshots() WHERE snap_id = %s", (snap,)).fetchone()[0]
    conn.execute("SELECT * FROM gsnap_restore_tables(ARRAY['ord', 'ord_line'], %s)", (taken_at,))
    assert {t: rows(conn, f"SELECT * FROM {t}") for t in want} == want


def test_restoring_tables_together_puts_a_self_referencing_table_back(conn):
    """A foreign key of a table on itself with ON DELETE CASCADE: in gsnap_restore, deleting
    the row added since would cascade into a row the restore was to update back (27000, see
    above); gsnap_restore_tables changes the rows in one statement, alone or with another
    table, the keys and their actions come once every row is back, and the table ends as the
    snapshot had it."""
    conn.execute("CREATE TABLE rs2 (id int PRIMARY KEY, parent int REFERENCES rs2 ON DELETE CASCADE, v int) USING gsnap")
    conn.execute("CREATE TABLE rs2_other (id int PRIMARY KEY, v int) USING gsnap")
    conn.execute("INSERT INTO rs2 SELECT g, NULL, 0 FROM generate_series(1, 100) g")
    conn.execute("INSERT INTO rs2_other SELECT g, 0 FROM generate_series(1, 10) g")
    snap = snapshot(conn)
    conn.execute("INSERT INTO rs2 VALUES (5000, NULL, 0)")
    conn.execute("UPDATE rs2 SET parent = 5000, v = 1 WHERE id = 5")
    conn.execute("UPDATE rs2_other SET v = 1 WHERE id = 1")
    conn.execute("BEGIN")
    with pytest.raises(psycopg.errors.TriggeredDataChangeViolation):
        restore(conn, f"'rs2', {snap}")
    conn.execute("ROLLBACK")
    conn.execute("BEGIN")
    assert restore_tables(conn, f"ARRAY['rs2'], {snap}") == {"public.rs2": (1, 1, 0)}
    assert rows(conn, "SELECT * FROM rs2") == rows(conn, f"SELECT * FROM gsnap_asof(NULL::rs2, {snap})")
    conn.execute("ROLLBACK")
    assert restore_tables(conn, f"ARRAY['rs2', 'rs2_other'], {snap}") == {
        "public.rs2": (1, 1, 0), "public.rs2_other": (0, 1, 0)}
    for t in ("rs2", "rs2_other"):
        assert rows(conn, f"SELECT * FROM {t}") == rows(conn, f"SELECT * FROM gsnap_asof(NULL::{t}, {snap})")


def test_restoring_tables_together_refuses_what_it_cannot_do(cluster, conn):
    conn.execute("CREATE TABLE rt_a (id int PRIMARY KEY, v int) USING gsnap")
    conn.execute("CREATE TABLE rt_b (id int PRIMARY KEY, v int) USING gsnap")
    conn.execute("CREATE TABLE rt_p (id int PRIMARY KEY, v int) PARTITION BY RANGE (id)")
    conn.execute("CREATE TABLE rt_p1 PARTITION OF rt_p FOR VALUES FROM (0) TO (100) USING gsnap")
    conn.execute("INSERT INTO rt_a SELECT g, g FROM generate_series(1, 10) g")
    conn.execute("INSERT INTO rt_b SELECT g, g FROM generate_series(1, 10) g")
    conn.execute("INSERT INTO rt_p SELECT g, g FROM generate_series(1, 10) g")
    snap = snapshot(conn)
    conn.execute("UPDATE rt_a SET v = 0; UPDATE rt_b SET v = 0; UPDATE rt_p SET v = 0")
    for call, state, text in [
        (f"ARRAY['rt_a', 'rt_a'], {snap}", "22023", "names table rt_a twice"),
        (f"ARRAY['rt_p', 'rt_p1'], {snap}", "22023", "and its partition"),
        (f"ARRAY[]::text[], {snap}", "22023", "no table"),
        (f"ARRAY['rt_a', NULL], {snap}", "22004", "must not be NULL"),
        (f"NULL::text[], {snap}", "22004", "must not be NULL"),
        (f"ARRAY['rt_a'], NULL::bigint", "22004", "must not be NULL"),
        (f"ARRAY['rt_a', 'rt_nosuch'], {snap}", "42P01", "rt_nosuch"),
        (f"ARRAY['rt_a', 'pg_class'], {snap}", "42P01", "pg_class is not in snapshot"),
    ]:
        with pytest.raises(psycopg.Error) as e:
            restore_tables(conn, call)
        assert e.value.sqlstate == state, (call, e.value)
        assert text is None or text in str(e.value), (call, e.value)
    assert conn.execute("SELECT sum(v) FROM rt_a").fetchone()[0] == 0
    # Privileges: every table's, the missing ones named; nothing changed.
    conn.execute("CREATE ROLE rt_writer LOGIN")
    conn.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON rt_a TO rt_writer")
    conn.execute("GRANT SELECT, INSERT ON rt_b TO rt_writer")
    with cluster.connect(user="rt_writer") as r:
        r.autocommit = True
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
            restore_tables(r, f"ARRAY['rt_a', 'rt_b'], {snap}")
        assert "rt_b" in str(e.value), e.value
    assert conn.execute("SELECT sum(v) FROM rt_a").fetchone()[0] == 0
    # A partitioned table with another table.
    assert restore_tables(conn, f"ARRAY['rt_p', 'rt_a', 'rt_b'], {snap}") == {
        "public.rt_p": (0, 10, 0), "public.rt_a": (0, 10, 0), "public.rt_b": (0, 10, 0)}
    assert conn.execute("SELECT sum(v) FROM rt_p").fetchone()[0] == 55


def test_a_dry_run_says_what_a_restore_would_do_and_changes_nothing(cluster, conn):
    """dry_run => true: the counts the restore would return, from the same diff, with nothing
    written, no snapshot taken, no trigger touched, no lock beyond a SELECT's; a role with
    only SELECT may ask. For gsnap_restore (with a condition, into a new table) and
    gsnap_restore_tables."""
    conn.execute("CREATE TABLE rdry (id int PRIMARY KEY, v int) USING gsnap")
    conn.execute("CREATE TABLE rdry_nokey (v int) USING gsnap")
    conn.execute("INSERT INTO rdry SELECT g, g FROM generate_series(1, 3000) g")
    conn.execute("INSERT INTO rdry_nokey SELECT g % 50 FROM generate_series(1, 500) g")
    snap = snapshot(conn)
    conn.execute("UPDATE rdry SET v = -v WHERE id <= 40")
    conn.execute("DELETE FROM rdry WHERE id BETWEEN 100 AND 109")
    conn.execute("INSERT INTO rdry VALUES (5000, 0), (5001, 0)")
    conn.execute("DELETE FROM rdry_nokey WHERE v = 7")
    conn.execute("INSERT INTO rdry_nokey VALUES (-1), (-1)")
    live = {t: rows(conn, f"SELECT * FROM {t}") for t in ("rdry", "rdry_nokey")}
    snaps = conn.execute("SELECT count(*) FROM gsnap_snapshots()").fetchone()[0]
    conn.execute("CREATE ROLE rdry_reader LOGIN")
    conn.execute("GRANT SELECT ON rdry, rdry_nokey TO rdry_reader")
    with cluster.connect(user="rdry_reader") as r:
        r.autocommit = True
        assert restore(r, f"'rdry', {snap}, dry_run => true") == (2, 40, 10)
        assert restore(r, f"'rdry', {snap}, condition => 'id < 20', dry_run => true") == (0, 19, 0)
        assert restore(r, f"'rdry_nokey', {snap}, dry_run => true") == (2, 0, 10)
        assert restore(r, f"'rdry', {snap}, into_table => 'rdry_copy', condition => 'id <= 1000', "
                          "dry_run => true") == (0, 0, 1000)
        assert restore_tables(r, f"ARRAY['rdry', 'rdry_nokey'], {snap}, dry_run => true") == {
            "public.rdry": (2, 40, 10), "public.rdry_nokey": (2, 0, 10)}
        # Without the dry run the reader is refused, naming what it lacks.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            restore(r, f"'rdry', {snap}")
    assert {t: rows(conn, f"SELECT * FROM {t}") for t in live} == live
    assert conn.execute("SELECT to_regclass('rdry_copy')").fetchone()[0] is None
    assert conn.execute("SELECT count(*) FROM gsnap_snapshots()").fetchone()[0] == snaps
    # In a transaction: only the ACCESS SHARE lock a SELECT takes.
    conn.execute("BEGIN")
    restore(conn, f"'rdry', {snap}, dry_run => true")
    modes = {m for (m,) in conn.execute("SELECT mode FROM pg_locks WHERE relation = 'rdry'::regclass "
                                        "AND pid = pg_backend_pid()")}
    conn.execute("ROLLBACK")
    assert modes == {"AccessShareLock"}, modes
    # The restore itself returns what the dry run said.
    assert restore(conn, f"'rdry', {snap}") == (2, 40, 10)
    assert restore(conn, f"'rdry_nokey', {snap}") == (2, 0, 10)
    with pytest.raises(psycopg.errors.NullValueNotAllowed):
        restore(conn, f"'rdry', {snap}, dry_run => NULL")
