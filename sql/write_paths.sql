--
-- Every write path of the gsnap access method records exactly the blocks it changed.
-- Each case starts a new span, performs one kind of write, and compares the recorded
-- blocks with the blocks the affected row versions occupy before and after.
--
CREATE TABLE wp (id int PRIMARY KEY, v text) USING gsnap
    WITH (autovacuum_enabled = off, fillfactor = 50);
-- Blocks of wp's rows whose id is in [lo, hi].
CREATE FUNCTION wp_blocks(lo int, hi int) RETURNS bigint[]
LANGUAGE sql AS $$
    SELECT coalesce(array_agg(DISTINCT block_of(ctid) ORDER BY block_of(ctid)), '{}')
    FROM wp WHERE id BETWEEN lo AND hi
$$;
-- Blocks seen before a change, to compare with what was recorded.
CREATE TEMP TABLE before_blocks (b bigint);
CREATE FUNCTION remember(lo int, hi int) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM before_blocks;
    INSERT INTO before_blocks SELECT unnest(wp_blocks(lo, hi));
$$;
CREATE FUNCTION before_and_after(lo int, hi int) RETURNS bigint[]
LANGUAGE sql AS $$
    SELECT array_agg(DISTINCT b ORDER BY b)
    FROM (SELECT b FROM before_blocks UNION SELECT unnest(wp_blocks(lo, hi))) s
$$;

-- tuple_insert: one row
SELECT FROM new_span();
INSERT INTO wp VALUES (1, 'one');
SELECT written('wp') AS recorded, wp_blocks(1, 1) AS expected;

-- tuple_insert: many rows over many pages (INSERT ... SELECT inserts row by row)
SELECT FROM new_span();
INSERT INTO wp SELECT i, repeat('x', 200) FROM generate_series(2, 400) i;
SELECT cardinality(written('wp')) AS pages, written('wp') = wp_blocks(2, 400) AS matches;

-- multi_insert: COPY
SELECT FROM new_span();
COPY wp FROM STDIN;
1001	a
1002	b
1003	c
\.
SELECT written('wp') AS recorded, wp_blocks(1001, 1003) AS expected;
SELECT FROM new_span();
COPY wp (id) FROM PROGRAM 'seq 3001 3600';
SELECT cardinality(written('wp')) AS pages, written('wp') = wp_blocks(3001, 3600) AS matches;

-- tuple_update, HOT (same block: v is not indexed and the page has room)
SELECT FROM remember(1, 1);
SELECT FROM new_span();
UPDATE wp SET v = 'uno' WHERE id = 1;
SELECT written('wp') AS recorded, before_and_after(1, 1) AS expected;

-- tuple_update, rows growing out of their pages: old and new blocks are both recorded
SELECT FROM remember(2, 60);
SELECT FROM new_span();
UPDATE wp SET v = repeat(v, 8) WHERE id BETWEEN 2 AND 60;
SELECT written('wp') = before_and_after(2, 60) AS matches,
       wp_blocks(2, 60) <> (SELECT array_agg(b ORDER BY b) FROM before_blocks) AS rows_moved;

-- tuple_update that changes the key (not HOT)
SELECT FROM remember(61, 61);
SELECT FROM new_span();
UPDATE wp SET id = 100061 WHERE id = 61;
SELECT written('wp') = (SELECT array_agg(DISTINCT b ORDER BY b) FROM (
           SELECT b FROM before_blocks UNION SELECT unnest(wp_blocks(100061, 100061))) s)
       AS matches;

-- tuple_delete
SELECT FROM remember(70, 80);
SELECT FROM new_span();
DELETE FROM wp WHERE id BETWEEN 70 AND 80;
SELECT written('wp') = (SELECT array_agg(b ORDER BY b) FROM before_blocks) AS matches;

-- tuple_lock: every row-locking mode
SELECT FROM new_span();
SELECT id FROM wp WHERE id = 3001 FOR UPDATE;
SELECT written('wp') AS recorded, wp_blocks(3001, 3001) AS expected;
SELECT FROM new_span();
SELECT count(*) FROM (SELECT id FROM wp WHERE id BETWEEN 3100 AND 3200 FOR SHARE) s;
SELECT written('wp') = wp_blocks(3100, 3200) AS matches;
SELECT FROM new_span();
SELECT id FROM wp WHERE id = 3300 FOR NO KEY UPDATE;
SELECT id FROM wp WHERE id = 3400 FOR KEY SHARE;
SELECT written('wp') = (SELECT array_agg(DISTINCT b ORDER BY b)
                        FROM unnest(wp_blocks(3300, 3300) || wp_blocks(3400, 3400)) b)
       AS matches;

-- tuple_insert_speculative + tuple_complete_speculative: INSERT ... ON CONFLICT
SELECT FROM new_span();
INSERT INTO wp VALUES (5000, 'new') ON CONFLICT DO NOTHING;
SELECT written('wp') AS recorded, wp_blocks(5000, 5000) AS expected;
-- a conflict found before inserting writes nothing
SELECT FROM new_span();
INSERT INTO wp VALUES (5000, 'again') ON CONFLICT DO NOTHING;
SELECT written('wp') AS recorded;
-- ON CONFLICT DO UPDATE locks and updates the existing row
SELECT FROM remember(5000, 5000);
SELECT FROM new_span();
INSERT INTO wp VALUES (5000, 'again') ON CONFLICT (id) DO UPDATE SET v = excluded.v;
SELECT written('wp') = before_and_after(5000, 5000) AS matches;

-- A rolled-back write is still recorded (heap changed the page; the capture decides).
SELECT FROM new_span();
BEGIN;
INSERT INTO wp VALUES (6000, 'rolled back');
SELECT block_of(ctid) AS block FROM wp WHERE id = 6000 \gset
ROLLBACK;
SELECT written('wp') = ARRAY[:block]::bigint[] AS matches;

-- Lazy VACUUM is not a recorded write: it only removes what no snapshot can see.
SELECT FROM new_span();
VACUUM wp;
SELECT written('wp') AS recorded;

-- Storage replacements mark the relation for a full capture.
SELECT FROM new_span();
SELECT gsnap_full_capture_pending('wp') AS before_truncate;
TRUNCATE wp;
SELECT gsnap_full_capture_pending('wp') AS after_truncate;
INSERT INTO wp SELECT i, 'v' FROM generate_series(1, 100) i;
SELECT FROM new_span();
VACUUM FULL wp;
SELECT gsnap_full_capture_pending('wp') AS after_vacuum_full;
SELECT FROM new_span();
CLUSTER wp USING wp_pkey;
SELECT gsnap_full_capture_pending('wp') AS after_cluster;
-- relation_nontransactional_truncate: TRUNCATE of a table created in the same transaction
BEGIN;
CREATE TABLE wp_new (id int) USING gsnap;
INSERT INTO wp_new VALUES (1);
SELECT FROM new_span();
SELECT gsnap_full_capture_pending('wp_new') AS before_truncate;
TRUNCATE wp_new;
SELECT gsnap_full_capture_pending('wp_new') AS after_truncate;
COMMIT;
-- A new table's first storage (relation_set_new_filenode)
SELECT FROM new_span();
CREATE TABLE wp_created (id int) USING gsnap;
SELECT gsnap_full_capture_pending('wp_created') AS new_table;

-- Other tables' writes are not attributed to wp.
SELECT FROM new_span();
INSERT INTO wp_created VALUES (1);
SELECT written('wp') AS wp, written('wp_created') AS wp_created;

-- A heap table is not tracked at all.
CREATE TABLE wp_heap (id int) USING heap;
SELECT FROM new_span();
INSERT INTO wp_heap VALUES (1);
SELECT written('wp_heap') AS heap_table;

DROP TABLE wp, wp_new, wp_created, wp_heap;
DROP FUNCTION wp_blocks(int, int), remember(int, int), before_and_after(int, int);
