--
-- Issue 11: a query over a snapshot planned before a schema change and run after it must
-- end in correct rows or a clean ERROR, never a crash: reads lock their table until the
-- transaction ends, plans depend on it, and scans check the row type they planned.
--
CREATE TABLE st (id int, s text) USING gsnap;
INSERT INTO st VALUES (1, '1000'), (2, '2000');
SELECT gsnap_snapshot() AS s \gset

-- A prepared AS OF, then the column's type changes: the statement is analyzed again and
-- PostgreSQL refuses the changed result type (before the fix: a segfault).
PREPARE p AS SELECT * FROM gsnap_asof(NULL::st, :s) ORDER BY id;
EXECUTE p;
ALTER TABLE st ALTER COLUMN s TYPE int USING s::int;
EXECUTE p;
DEALLOCATE p;
PREPARE p AS SELECT * FROM gsnap_asof(NULL::st, :s) ORDER BY id;
EXECUTE p;
-- A change that keeps the result type replans silently and reads right.
PREPARE q AS SELECT id, s + 1 AS next FROM gsnap_asof(NULL::st, :s) ORDER BY id;
EXECUTE q;
ALTER TABLE st ADD COLUMN extra text;
EXECUTE q;
ALTER TABLE st DROP COLUMN extra;
EXECUTE q;
ALTER TABLE st RENAME COLUMN s TO amount;
EXECUTE q;
DEALLOCATE ALL;

-- Dropped columns: the prepared statement never reads pointer bits as values.
CREATE TABLE sd (id int, a int, s text) USING gsnap;
INSERT INTO sd VALUES (1, 10, 'one'), (2, 20, 'two');
SELECT gsnap_snapshot() AS d \gset
PREPARE r AS SELECT * FROM gsnap_asof(NULL::sd, :d) ORDER BY id;
EXECUTE r;
ALTER TABLE sd DROP COLUMN a;
EXECUTE r;
DEALLOCATE r;
PREPARE r AS SELECT * FROM gsnap_asof(NULL::sd, :d) ORDER BY id;
EXECUTE r;
DEALLOCATE r;
-- The same through gsnap_range and its field selections.
PREPARE rr AS SELECT snap_id = :d AS at_d, (rec).s FROM gsnap_range(NULL::sd, :d, :d) ORDER BY 2;
EXECUTE rr;
ALTER TABLE sd ALTER COLUMN s TYPE varchar(10);
EXECUTE rr;
DEALLOCATE rr;

-- PL/pgSQL caches its plan: call, change, call again.
CREATE FUNCTION st_total(snap bigint) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT sum(amount) FROM gsnap_asof(NULL::st, snap));
END $$;
SELECT st_total(:s);
ALTER TABLE st ALTER COLUMN amount TYPE bigint;
SELECT st_total(:s);
ALTER TABLE st RENAME COLUMN amount TO s;
SELECT sqlstate_of(format('SELECT st_total(%s)', :s));
DROP FUNCTION st_total(bigint);

-- A cursor keeps its table open: the same session cannot change it under the cursor.
CREATE TABLE cy (id int, s text) USING gsnap;
INSERT INTO cy SELECT g, 'row ' || g FROM generate_series(1, 5) g;
SELECT gsnap_snapshot() AS c \gset
BEGIN;
DECLARE cur CURSOR FOR SELECT * FROM gsnap_asof(NULL::cy, :c);
FETCH 2 FROM cur;
SAVEPOINT before_alter;
ALTER TABLE cy DROP COLUMN s;
ROLLBACK TO before_alter;
DROP TABLE cy;
ROLLBACK TO before_alter;
TRUNCATE cy;
ROLLBACK TO before_alter;
FETCH 3 FROM cur;
COMMIT;
-- The function path keeps the table open too (a function scan calls the function only at
-- the first fetch): gsnap_diff, and a call in the select list.
BEGIN;
DECLARE fcur CURSOR FOR SELECT change, (rec).id FROM gsnap_diff(NULL::cy, :c, :c);
SAVEPOINT before_alter;
ALTER TABLE cy ADD COLUMN z int;
ROLLBACK TO before_alter;
FETCH ALL FROM fcur;
DECLARE scur CURSOR FOR SELECT gsnap_asof(NULL::cy, :c);
SAVEPOINT before_drop;
DROP TABLE cy;
ROLLBACK TO before_drop;
FETCH 1 FROM scur;
COMMIT;
-- A WITH HOLD cursor is materialized at commit: changes after that are fine.
BEGIN;
DECLARE held CURSOR WITH HOLD FOR SELECT * FROM gsnap_asof(NULL::cy, :c) ORDER BY id;
FETCH 1 FROM held;
COMMIT;
ALTER TABLE cy DROP COLUMN s;
FETCH ALL FROM held;
CLOSE held;

-- The read holds ACCESS SHARE on the table until the transaction ends.
BEGIN;
SELECT count(*) FROM gsnap_asof(NULL::cy, :c);
SELECT mode, granted FROM pg_locks
WHERE relation = 'cy'::regclass AND pid = pg_backend_pid() ORDER BY mode;
COMMIT;
BEGIN;
SELECT count(*) FROM gsnap_range(NULL::cy, :c, :c);
SELECT count(*) FROM gsnap_diff(NULL::cy, :c, :c);
SELECT mode, granted FROM pg_locks
WHERE relation = 'cy'::regclass AND pid = pg_backend_pid() ORDER BY mode;
COMMIT;

-- Declaring a snapshot while this transaction holds a lock the declaration needs fails at
-- once instead of waiting forever.
SET statement_timeout = '20s';
BEGIN;
TRUNCATE cy;
SELECT sqlstate_of('SELECT gsnap_snapshot()');
ROLLBACK;
BEGIN;
LOCK TABLE st IN ACCESS EXCLUSIVE MODE;
SELECT sqlstate_of('SELECT gsnap_snapshot(false)');
ROLLBACK;
BEGIN;
ALTER TABLE sd ADD COLUMN z int;
SELECT sqlstate_of('SELECT gsnap_snapshot()');
ROLLBACK;
-- A table created in the same transaction is no obstacle (the worker cannot see it yet).
BEGIN;
CREATE TABLE fresh (id int) USING gsnap;
SELECT gsnap_snapshot() > 0 AS declared;
ROLLBACK;
RESET statement_timeout;

-- Bad arguments are the caller's errors, never internal ones.
SELECT sqlstate_of('SELECT gsnap_written_blocks(0)');
SELECT sqlstate_of('SELECT gsnap_full_capture_pending(0)');
CREATE TABLE plain_heap (id int) USING heap;
SELECT written('plain_heap') AS heap_table_records_nothing;
CREATE TABLE gone (id int) USING gsnap;
SELECT 'gone'::regclass::oid AS gone_oid \gset
DROP TABLE gone;
SELECT split_part(sqlstate_of(format('SELECT gsnap_full_capture_pending(%s)', :gone_oid)), ':', 1);

-- One rule for snapshots that do not hold a table: no rows from those snapshots, and an
-- ERROR when none of the snapshots read holds it.
CREATE TABLE late (id int) USING heap;
INSERT INTO late VALUES (1);
SELECT gsnap_snapshot() AS before_gsnap \gset
ALTER TABLE late SET ACCESS METHOD gsnap;
SELECT gsnap_snapshot() AS after_gsnap \gset
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::late, %s)', :before_gsnap));
SELECT sqlstate_of(format('SELECT * FROM gsnap_range(NULL::late, %s, %s)', :before_gsnap, :before_gsnap));
SELECT snap_id = :after_gsnap AS at_after, (rec).id FROM gsnap_range(NULL::late, :before_gsnap, :after_gsnap);
SELECT change, (rec).id FROM gsnap_diff(NULL::late, :before_gsnap, :after_gsnap);
SELECT sqlstate_of(format('SELECT * FROM gsnap_range(NULL::late, %s, %s)', :after_gsnap + 1000, :after_gsnap + 2000));

DROP TABLE st, sd, cy, plain_heap, late;
