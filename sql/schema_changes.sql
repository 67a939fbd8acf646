--
-- Rows come back in the table's current row type: columns added since the snapshot read
-- as NULL, dropped columns are skipped, renamed columns keep their values, and a column
-- whose type changed is converted as CAST(old::text AS new_type) would.
--
CREATE TABLE sc (id int, a int, b text, c varchar(10), d int) USING gsnap;
INSERT INTO sc VALUES (1, 10, 'bee', 'see', 100), (2, 20, NULL, 'sea', 200);
-- a column added with a default before the snapshot: old rows show the default
ALTER TABLE sc ADD COLUMN e text DEFAULT 'dflt';
INSERT INTO sc VALUES (3, 30, 'b3', 'c3', 300, 'explicit');
SELECT gsnap_snapshot() AS s \gset
SELECT * FROM gsnap_asof(NULL::sc, :s) ORDER BY id;

-- add, drop, rename, retype after the snapshot
ALTER TABLE sc ADD COLUMN f int;
ALTER TABLE sc ADD COLUMN g text DEFAULT 'new default';
ALTER TABLE sc DROP COLUMN b;
ALTER TABLE sc RENAME COLUMN c TO c_renamed;
ALTER TABLE sc ALTER COLUMN a TYPE bigint;
ALTER TABLE sc ALTER COLUMN d TYPE text;
UPDATE sc SET a = a * 1000, f = 1;
SELECT * FROM gsnap_asof(NULL::sc, :s) ORDER BY id;
SELECT * FROM sc ORDER BY id;
-- a later snapshot (after the rewrites) shows the new shape and values
SELECT gsnap_snapshot() AS s2 \gset
SELECT * FROM gsnap_asof(NULL::sc, :s2) ORDER BY id;

-- a type change the old values do not survive is reported when they are read
CREATE TABLE sc2 (id int, v text) USING gsnap;
INSERT INTO sc2 VALUES (1, '42'), (2, 'not a number');
SELECT gsnap_snapshot() AS s3 \gset
DELETE FROM sc2 WHERE id = 2;
ALTER TABLE sc2 ALTER COLUMN v TYPE int USING v::int;
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::sc2, %s)', :s3));

DROP TABLE sc, sc2;
