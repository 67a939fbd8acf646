--
-- Queries over sets of snapshots: gsnap_range and gsnap_diff, answered from the GSnap
-- index; gsnap_groups and gsnap_index_stats show the index.
--
CREATE TABLE ss (id int PRIMARY KEY, v text, n int) USING gsnap;
INSERT INTO ss SELECT i, 'v' || i, 0 FROM generate_series(1, 3000) i;
SELECT gsnap_snapshot() AS s1 \gset
CREATE TEMP TABLE ss_at (snap bigint, id int, v text, n int);
INSERT INTO ss_at SELECT :s1, * FROM ss;
-- a few snapshots with small changes
UPDATE ss SET n = n + 1 WHERE id % 100 = 0;
SELECT gsnap_snapshot() AS s2 \gset
INSERT INTO ss_at SELECT :s2, * FROM ss;
DELETE FROM ss WHERE id BETWEEN 500 AND 520;
INSERT INTO ss VALUES (9001, 'new', 9);
SELECT gsnap_snapshot() AS s3 \gset
INSERT INTO ss_at SELECT :s3, * FROM ss;
SELECT gsnap_snapshot() AS s4 \gset
INSERT INTO ss_at SELECT :s4, * FROM ss;

-- gsnap_range returns each snapshot's rows exactly
SELECT snap_id - :s1 AS snap, count(*) FROM gsnap_range(NULL::ss, :s1, :s4) GROUP BY 1 ORDER BY 1;
SELECT count(*) AS mismatches FROM (
    (SELECT snap_id, (rec).* FROM gsnap_range(NULL::ss, :s1, :s4)
     EXCEPT ALL SELECT * FROM ss_at)
    UNION ALL
    (SELECT * FROM ss_at
     EXCEPT ALL SELECT snap_id, (rec).* FROM gsnap_range(NULL::ss, :s1, :s4))) d;
-- a sub-range, and a range of one snapshot equals gsnap_asof
SELECT snap_id - :s1 AS snap, count(*) FROM gsnap_range(NULL::ss, :s2, :s3) GROUP BY 1 ORDER BY 1;
SELECT (SELECT count(*) FROM gsnap_range(NULL::ss, :s3, :s3))
     = (SELECT count(*) FROM gsnap_asof(NULL::ss, :s3)) AS one_snapshot;
-- the history of one row across snapshots
SELECT snap_id - :s1 AS snap, (rec).n FROM gsnap_range(NULL::ss, :s1, :s4)
WHERE (rec).id = 100 ORDER BY 1;

-- gsnap_diff: an update is one removed and one added row; deletes and inserts too
SELECT change, (rec).* FROM gsnap_diff(NULL::ss, :s2, :s3) WHERE (rec).id NOT BETWEEN 500 AND 520
ORDER BY (rec).id, change;
SELECT change, count(*) FROM gsnap_diff(NULL::ss, :s1, :s2) GROUP BY 1 ORDER BY 1;
SELECT change, count(*) FROM gsnap_diff(NULL::ss, :s1, :s3) GROUP BY 1 ORDER BY 1;
-- no change, either way round
SELECT count(*) AS no_change FROM gsnap_diff(NULL::ss, :s3, :s4);
SELECT change, count(*) FROM gsnap_diff(NULL::ss, :s3, :s1) GROUP BY 1 ORDER BY 1;
-- how a diff reads the pages that changed: from the delta the capture kept with each changed
-- page's new image; a block that changed twice in between (s1 to s3) from both images
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT * FROM gsnap_diff(NULL::ss, :s1, :s2);
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT * FROM gsnap_diff(NULL::ss, :s1, :s3);

-- across a rewrite (new storage, new incarnation): rows that only moved are no change
VACUUM FULL ss;
UPDATE ss SET v = 'after rewrite' WHERE id = 1;
SELECT gsnap_snapshot() AS s5 \gset
INSERT INTO ss_at SELECT :s5, * FROM ss;
SELECT change, (rec).* FROM gsnap_diff(NULL::ss, :s4, :s5) ORDER BY (rec).id, change;
SELECT snap_id - :s1 AS snap, count(*) FROM gsnap_range(NULL::ss, :s3, :s5) GROUP BY 1 ORDER BY 1;
SELECT count(*) AS mismatches FROM (
    (SELECT snap_id, (rec).* FROM gsnap_range(NULL::ss, :s1, :s5)
     EXCEPT ALL SELECT * FROM ss_at)
    UNION ALL
    (SELECT * FROM ss_at
     EXCEPT ALL SELECT snap_id, (rec).* FROM gsnap_range(NULL::ss, :s1, :s5))) d;

-- a table created between two snapshots: everything is added
CREATE TABLE ss_new (id int) USING gsnap;
INSERT INTO ss_new SELECT generate_series(1, 5);
SELECT gsnap_snapshot() AS s6 \gset
SELECT change, count(*) FROM gsnap_diff(NULL::ss_new, :s5, :s6) GROUP BY 1;
SELECT count(*) FROM gsnap_range(NULL::ss_new, :s1, :s6);

-- bad input
SELECT sqlstate_of(format('SELECT * FROM gsnap_range(NULL::ss, %s, %s)', :s3, :s1));
SELECT sqlstate_of(format('SELECT * FROM gsnap_range(NULL::ss, NULL, %s)', :s3));
SELECT sqlstate_of(format('SELECT * FROM gsnap_diff(NULL::ss, %s, 0)', :s3));
SELECT sqlstate_of('SELECT * FROM gsnap_diff(NULL::ss_new, 1, 2)');

-- the index: groups cover every committed snapshot, once
SELECT count(*) > 0 AS has_groups, bool_and(first_snap <= last_snap) AS spans_ok,
       count(*) FILTER (WHERE state = 'active') <= 1 AS one_active
FROM gsnap_groups();
SELECT (SELECT sum(snapshots) FROM gsnap_groups())
     = (SELECT count(*) FROM gsnap_snapshots() WHERE state = 'committed') AS every_snapshot_indexed;
SELECT group_hits + group_loads > 0 AS groups_used, image_hits + image_loads > 0 AS images_used,
       group_cache_used <= group_cache_bytes AS within_budget
FROM gsnap_index_stats();

-- gsnap_diff within one incarnation: rows written again with the same values (new versions
-- under other line pointers, HOT or on other pages) are no change; a changed page with
-- changed and unchanged rows reports only the changed ones
CREATE TABLE sm (id int, v text, pad text) USING gsnap WITH (fillfactor = 100);
INSERT INTO sm SELECT i, 'v' || i, repeat('x', 200) FROM generate_series(1, 400) i;
SELECT gsnap_snapshot() AS m1 \gset
UPDATE sm SET v = v WHERE id % 10 = 0;
UPDATE sm SET v = 'changed' WHERE id IN (15, 215);
UPDATE sm SET v = NULL WHERE id = 16;
SELECT gsnap_snapshot() AS m2 \gset
SELECT change, (rec).id, (rec).v FROM gsnap_diff(NULL::sm, :m1, :m2) ORDER BY 2, 1;
SELECT count(*) AS mismatches FROM (
    (SELECT (rec).* FROM gsnap_range(NULL::sm, :m2, :m2) EXCEPT ALL SELECT * FROM sm)
    UNION ALL (SELECT * FROM sm EXCEPT ALL SELECT * FROM gsnap_asof(NULL::sm, :m2))) d;

-- gsnap_range is a streaming scan; conditions on rec alone are checked once per row and run
-- of snapshots sharing its page, conditions on snap_id (or volatile ones) per result row
EXPLAIN (COSTS OFF)
SELECT snap_id FROM gsnap_range(NULL::sm, :m1, :m2) WHERE (rec).id = 15 AND snap_id > 0;
SELECT snap_id - :m1 AS snap, (rec).v FROM gsnap_range(NULL::sm, :m1, :m2)
WHERE (rec).id IN (15, 16, 17) AND snap_id >= :m1 ORDER BY (rec).id, 1;
SELECT count(*) FROM gsnap_range(NULL::sm, :m1, :m2) WHERE (rec).id = 15 AND random() >= 0;
-- a whole-row reference keeps the function scan; both return the same rows
EXPLAIN (COSTS OFF) SELECT r FROM gsnap_range(NULL::sm, :m1, :m2) r;
SELECT count(*) AS mismatches FROM (
    (SELECT r.snap_id, (r.rec).* FROM gsnap_range(NULL::sm, :m1, :m2) r WHERE r IS NOT NULL
     EXCEPT ALL SELECT snap_id, (rec).* FROM gsnap_range(NULL::sm, :m1, :m2))
    UNION ALL
    (SELECT snap_id, (rec).* FROM gsnap_range(NULL::sm, :m1, :m2)
     EXCEPT ALL SELECT r.snap_id, (r.rec).* FROM gsnap_range(NULL::sm, :m1, :m2) r
     WHERE r IS NOT NULL)) d;
-- snapshot arguments from a subquery (evaluated at the first fetch), and rescans with a
-- condition on rec that changes with the outer row
SELECT count(*) FROM gsnap_range(NULL::sm, (SELECT :m1::bigint), :m2);
SELECT x, (SELECT count(*) FROM gsnap_range(NULL::sm, :m1, :m2) r WHERE (r.rec).id = x)
FROM (VALUES (15), (16), (17), (9999)) v(x) ORDER BY x;

-- gsnap_versions: each distinct row version once, with its run of snapshots (15 and 16
-- changed between m1 and m2; 20 was updated to the same value, which is a new version too;
-- 14 did not change)
SELECT first_snap - :m1 AS first, last_snap - :m1 AS last, (rec).id, (rec).v
FROM gsnap_versions(NULL::sm, :m1, :m2) WHERE (rec).id IN (14, 15, 16, 20) ORDER BY 3, 1;
EXPLAIN (COSTS OFF)
SELECT * FROM gsnap_versions(NULL::sm, :m1, :m2) WHERE (rec).id = 15 AND first_snap > 0;
SELECT count(*) AS mismatches FROM (
    (SELECT first_snap, last_snap, (rec).* FROM gsnap_versions(NULL::sm, :m1, :m2)
     EXCEPT ALL SELECT first_snap, last_snap, (rec).* FROM gsnap_versions(NULL::sm, :m1, :m2)
     WITH ORDINALITY)
    UNION ALL
    (SELECT first_snap, last_snap, (rec).* FROM gsnap_versions(NULL::sm, :m1, :m2)
     WITH ORDINALITY
     EXCEPT ALL SELECT first_snap, last_snap, (rec).* FROM gsnap_versions(NULL::sm, :m1, :m2))) d;

DROP TABLE ss, ss_new, sm;
