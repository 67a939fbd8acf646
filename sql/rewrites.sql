--
-- TRUNCATE, VACUUM FULL, CLUSTER, SET TABLESPACE-free rewrites, SET ACCESS METHOD and
-- ALTER TABLE rewrites between snapshots: every snapshot still reads what it held.
--
CREATE TABLE rw (id int PRIMARY KEY, v text) USING gsnap;
INSERT INTO rw SELECT i, 'first ' || i FROM generate_series(1, 3000) i;
SELECT gsnap_snapshot() AS s1 \gset
CREATE TEMP TABLE rw1 AS SELECT * FROM rw;

TRUNCATE rw;
INSERT INTO rw SELECT i, 'second ' || i FROM generate_series(1, 10) i;
SELECT gsnap_snapshot() AS s2 \gset
CREATE TEMP TABLE rw2 AS SELECT * FROM rw;

-- the table grows again after the truncation: blocks beyond the old ones must not show
-- the rows from before TRUNCATE
INSERT INTO rw SELECT i, 'third ' || i FROM generate_series(11, 500) i;
DELETE FROM rw WHERE id % 2 = 0;
VACUUM FULL rw;
SELECT gsnap_snapshot() AS s3 \gset
CREATE TEMP TABLE rw3 AS SELECT * FROM rw;

CLUSTER rw USING rw_pkey;
UPDATE rw SET v = v || '!' WHERE id < 50;
SELECT gsnap_snapshot() AS s4 \gset
CREATE TEMP TABLE rw4 AS SELECT * FROM rw;

ALTER TABLE rw ALTER COLUMN v TYPE varchar(100);
ALTER TABLE rw SET ACCESS METHOD heap;
ALTER TABLE rw SET ACCESS METHOD gsnap;
INSERT INTO rw VALUES (100000, 'after the round trip');
SELECT gsnap_snapshot() AS s5 \gset
CREATE TEMP TABLE rw5 AS SELECT * FROM rw;

SELECT asof_matches('rw', :s1, 'rw1') AS s1, asof_matches('rw', :s2, 'rw2') AS s2,
       asof_matches('rw', :s3, 'rw3') AS s3, asof_matches('rw', :s4, 'rw4') AS s4,
       asof_matches('rw', :s5, 'rw5') AS s5;
SELECT (SELECT count(*) FROM gsnap_asof(NULL::rw, :s1)) AS n1,
       (SELECT count(*) FROM gsnap_asof(NULL::rw, :s2)) AS n2,
       (SELECT count(*) FROM gsnap_asof(NULL::rw, :s3)) AS n3,
       (SELECT count(*) FROM gsnap_asof(NULL::rw, :s5)) AS n5;
-- every rewrite gave the table a new storage identity, captured completely
SELECT count(DISTINCT relfilenode) AS storages, count(DISTINCT incarnation) AS incarnations
FROM (SELECT t.* FROM gsnap_snapshots() s, gsnap_snapshot_tables(s.snap_id) t
      WHERE t.table_oid = 'rw'::regclass AND s.snap_id IN (:s1, :s2, :s3, :s4, :s5)) x;

-- while a TRUNCATE holds its lock, a declaration waits for it (never snapshots the middle)
-- and writers are never blocked by gsnap: checked by the integration tests.
DROP TABLE rw;
