--
-- Bad input to gsnap_asof and the snapshot functions: each a clear error.
--
CREATE TABLE ae (id int, v text) USING gsnap;
INSERT INTO ae VALUES (1, 'one');
CREATE TABLE ae_heap (id int) USING heap;
SELECT gsnap_snapshot() AS s \gset

-- unknown snapshots
SELECT sqlstate_of('SELECT * FROM gsnap_asof(NULL::ae, 999999)');
SELECT sqlstate_of('SELECT * FROM gsnap_asof(NULL::ae, 0)');
SELECT sqlstate_of('SELECT * FROM gsnap_asof(NULL::ae, -5)');
SELECT * FROM gsnap_asof(NULL::ae, 999999);
-- NULL arguments
SELECT sqlstate_of('SELECT * FROM gsnap_asof(NULL::ae, NULL::bigint)');
SELECT sqlstate_of('SELECT * FROM gsnap_asof(NULL::ae, NULL::timestamptz)');
-- a time before the first snapshot
SELECT sqlstate_of($$SELECT * FROM gsnap_asof(NULL::ae, '1999-01-01'::timestamptz)$$);
-- a table that is not in the snapshot: a heap table, one created later
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::ae_heap, %s)', :s));
CREATE TABLE ae_later (id int) USING gsnap;
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::ae_later, %s)', :s));
SELECT * FROM gsnap_asof(NULL::ae_later, 1);
-- a temporary gsnap table is never snapshotted
CREATE TEMP TABLE ae_temp (id int) USING gsnap;
SELECT gsnap_snapshot() AS s2 \gset
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::ae_temp, %s)', :s2));
-- the first argument must be a table's row type
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::int, %s)', :s));
CREATE TYPE ae_composite AS (a int);
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::ae_composite, %s)', :s));
CREATE VIEW ae_view AS SELECT * FROM ae;
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::ae_view, %s)', :s));
-- a partitioned table reads its gsnap partitions; one of its partitions is not a gsnap table
CREATE TABLE ae_parted (id int) PARTITION BY RANGE (id);
CREATE TABLE ae_parted_heap PARTITION OF ae_parted FOR VALUES FROM (0) TO (10);
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::ae_parted, %s)', :s));
-- listing the tables of an unknown snapshot
SELECT sqlstate_of('SELECT * FROM gsnap_snapshot_tables(123456789)');
-- a good read still works after all that
SELECT * FROM gsnap_asof(NULL::ae, :s);

DROP VIEW ae_view;
DROP TABLE ae, ae_heap, ae_later, ae_parted;
DROP TYPE ae_composite;
