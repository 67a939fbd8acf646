--
-- VACUUM, VACUUM FULL, CLUSTER, TRUNCATE and ANALYZE on gsnap tables, compared with heap.
--
CREATE TABLE mt_h (id int PRIMARY KEY, k int, v text) USING heap
    WITH (autovacuum_enabled = off);
CREATE TABLE mt_g (LIKE mt_h INCLUDING ALL) USING gsnap;
SELECT on_both($$INSERT INTO %s SELECT i, (i * 7919) % 1000, repeat('v', 50)
                 FROM generate_series(1, 3000) i$$, 'mt_h', 'mt_g');
SELECT on_both($$DELETE FROM %s WHERE id % 4 = 0$$, 'mt_h', 'mt_g');
SELECT on_both($$UPDATE %s SET v = 'updated' WHERE id % 5 = 0$$, 'mt_h', 'mt_g');

-- VACUUM (and its variants) frees the same space on both
VACUUM mt_h;
VACUUM mt_g;
SELECT same_rows('mt_h', 'mt_g');
VACUUM (FREEZE, ANALYZE) mt_h;
VACUUM (FREEZE, ANALYZE) mt_g;
VACUUM (INDEX_CLEANUP ON, TRUNCATE ON) mt_g;
SELECT (SELECT pg_relation_size('mt_h')) = (SELECT pg_relation_size('mt_g')) AS same_size;
SELECT same_rows('mt_h', 'mt_g');

-- ANALYZE fills the statistics
ANALYZE mt_g;
SELECT attname, null_frac, n_distinct > 0 OR n_distinct < 0 AS has_distinct
FROM pg_stats WHERE tablename = 'mt_g' ORDER BY attname;
SELECT reltuples FROM pg_class WHERE relname = 'mt_g';

-- VACUUM FULL rewrites the table: same rows, compacted
SELECT pg_relation_filenode('mt_g') AS filenode_before \gset
VACUUM FULL mt_h;
VACUUM FULL mt_g;
SELECT pg_relation_filenode('mt_g') <> :filenode_before AS new_storage;
SELECT same_rows('mt_h', 'mt_g');
SELECT (SELECT pg_relation_size('mt_h')) = (SELECT pg_relation_size('mt_g')) AS same_size;

-- CLUSTER orders the rows by an index
CREATE INDEX mt_h_k ON mt_h (k);
CREATE INDEX mt_g_k ON mt_g (k);
CLUSTER mt_h USING mt_h_k;
CLUSTER mt_g USING mt_g_k;
SELECT same_rows('mt_h', 'mt_g');
SELECT id, k FROM mt_g ORDER BY ctid LIMIT 5;
CLUSTER mt_g;  -- again, by the remembered index
SELECT count(*) FROM mt_g;

-- TRUNCATE (also in a rolled-back transaction)
BEGIN;
TRUNCATE mt_g;
SELECT count(*) FROM mt_g;
ROLLBACK;
SELECT count(*) FROM mt_g;
TRUNCATE mt_g;
SELECT count(*), pg_relation_size('mt_g') FROM mt_g;
INSERT INTO mt_g VALUES (1, 1, 'after truncate');
SELECT * FROM mt_g;

-- the maintenance commands work on a table that has a TOAST table and indexes
CREATE TABLE mt_toast (id int PRIMARY KEY, big text) USING gsnap;
INSERT INTO mt_toast SELECT i, repeat(md5(i::text), 200) FROM generate_series(1, 50) i;
VACUUM FULL mt_toast;
CLUSTER mt_toast USING mt_toast_pkey;
VACUUM mt_toast;
SELECT count(*), sum(length(big)) FROM mt_toast;

DROP TABLE mt_h, mt_g, mt_toast;
