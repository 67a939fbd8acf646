--
-- gsnap_asof in FROM is planned as a custom scan that streams rows (no tuplestore); the
-- cases it does not handle keep the function scan. Both return the same rows.
--
CREATE TABLE sc_t (id int PRIMARY KEY, grp int, note text) USING gsnap;
INSERT INTO sc_t SELECT i, i % 10, 'note ' || i FROM generate_series(1, 5000) i;
SELECT gsnap_snapshot() AS s \gset
UPDATE sc_t SET note = 'later' WHERE id <= 100;

EXPLAIN (COSTS OFF) SELECT count(*) FROM gsnap_asof(NULL::sc_t, :s);
EXPLAIN (COSTS OFF) SELECT id FROM gsnap_asof(NULL::sc_t, :s) WHERE grp = 3 AND id < 50;
SELECT id, note FROM gsnap_asof(NULL::sc_t, :s) WHERE grp = 3 AND id < 50 ORDER BY id;
-- a whole-row reference streams too (the row is one more scan column); WITH ORDINALITY keeps
-- the function scan
EXPLAIN (COSTS OFF) SELECT t FROM gsnap_asof(NULL::sc_t, :s) t WHERE t.id = 1;
SELECT t FROM gsnap_asof(NULL::sc_t, :s) t WHERE t.id = 1;
EXPLAIN (COSTS OFF) SELECT * FROM gsnap_asof(NULL::sc_t, :s) WITH ORDINALITY LIMIT 1;
-- both plans return the same rows
SELECT (SELECT count(*) FROM gsnap_asof(NULL::sc_t, :s))
     = (SELECT count(*) FROM gsnap_asof(NULL::sc_t, :s) t WHERE t IS NOT NULL) AS same_count;
-- joins with the live table, aggregates, LIMIT
SELECT count(*) AS changed_since
FROM gsnap_asof(NULL::sc_t, :s) a JOIN sc_t b USING (id) WHERE a.note <> b.note;
SELECT grp, count(*) FROM gsnap_asof(NULL::sc_t, :s) GROUP BY grp ORDER BY grp LIMIT 3;
SELECT count(*) FROM (SELECT * FROM gsnap_asof(NULL::sc_t, :s) LIMIT 7) l;
-- the snapshot argument may be any expression, also one evaluated per outer row (rescan)
SELECT count(*) FROM gsnap_asof(NULL::sc_t, (SELECT max(snap_id) FROM gsnap_snapshots()));
DELETE FROM sc_t WHERE grp = 1 AND id <= 100;
SELECT gsnap_snapshot() AS s2 \gset
SELECT s.snap_id = :s AS first_snapshot,
       (SELECT count(*) FROM gsnap_asof(NULL::sc_t, s.snap_id) x WHERE x.grp = 1) AS grp1
FROM gsnap_snapshots() s WHERE s.snap_id IN (:s, :s2) ORDER BY 1;
-- prepared statements re-run the scan
PREPARE asof_count(bigint) AS SELECT count(*) FROM gsnap_asof(NULL::sc_t, $1);
EXECUTE asof_count(:s);
EXECUTE asof_count(:s);
-- a cancelled scan releases its pins: a statement timeout in the middle, then a full read
SET statement_timeout = '1ms';
SELECT count(*) FROM gsnap_asof(NULL::sc_t, :s) a, gsnap_asof(NULL::sc_t, :s) b;
RESET statement_timeout;
SELECT count(*) FROM gsnap_asof(NULL::sc_t, :s);
DEALLOCATE asof_count;
DROP TABLE sc_t;
