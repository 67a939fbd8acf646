--
-- Indexes on gsnap tables: B-tree, GIN, GiST, BRIN, hash, built plainly, concurrently and
-- in parallel, rebuilt, and used by scans that return what the same scans on heap return.
--
CREATE TABLE ix_h (id int, k int, tags text[], doc jsonb, pos point, span int4range,
                   body tsvector) USING heap;
CREATE TABLE ix_g (LIKE ix_h) USING gsnap;
SELECT on_both($$INSERT INTO %s
    SELECT i, i % 100, ARRAY['t' || (i % 5), 't' || (i % 11)], jsonb_build_object('n', i % 13),
           point(i % 50, i / 50), int4range(i, i + 10), to_tsvector('simple', 'word' || (i % 17))
    FROM generate_series(1, 5000) i$$, 'ix_h', 'ix_g');

CREATE UNIQUE INDEX ix_g_id ON ix_g (id);
CREATE INDEX ix_g_k ON ix_g USING btree (k) INCLUDE (id);
CREATE INDEX ix_g_tags ON ix_g USING gin (tags);
CREATE INDEX ix_g_doc ON ix_g USING gin (doc jsonb_path_ops);
CREATE INDEX ix_g_body ON ix_g USING gin (body);
CREATE INDEX ix_g_pos ON ix_g USING gist (pos);
CREATE INDEX ix_g_span ON ix_g USING gist (span);
CREATE INDEX ix_g_brin ON ix_g USING brin (id) WITH (pages_per_range = 4);
CREATE INDEX ix_g_hash ON ix_g USING hash (k);
CREATE INDEX ix_g_expr ON ix_g ((k * 2)) WHERE k < 50;
-- the same on heap
CREATE UNIQUE INDEX ix_h_id ON ix_h (id);
CREATE INDEX ix_h_tags ON ix_h USING gin (tags);
CREATE INDEX ix_h_pos ON ix_h USING gist (pos);
CREATE INDEX ix_h_brin ON ix_h USING brin (id) WITH (pages_per_range = 4);

-- CREATE INDEX CONCURRENTLY runs heap's validate scan
CREATE INDEX CONCURRENTLY ix_g_k_conc ON ix_g (k, id);
SELECT indexrelid::regclass, indisvalid, indisready FROM pg_index
WHERE indrelid = 'ix_g'::regclass ORDER BY indexrelid::regclass::text;

-- A parallel index build
SET max_parallel_maintenance_workers = 2;
SET min_parallel_table_scan_size = 0;
CREATE INDEX ix_g_par ON ix_g (k, id);
RESET max_parallel_maintenance_workers;
RESET min_parallel_table_scan_size;

-- Index scans give what heap's sequential scans give
SET enable_seqscan = off;
SET enable_bitmapscan = on;
EXPLAIN (COSTS OFF) SELECT id FROM ix_g WHERE id = 42;
SELECT id, k FROM ix_g WHERE id = 42;
EXPLAIN (COSTS OFF) SELECT count(*) FROM ix_g WHERE tags @> ARRAY['t3'];
SELECT (SELECT count(*) FROM ix_g WHERE tags @> ARRAY['t3', 't7']) AS gsnap,
       (SELECT count(*) FROM ix_h WHERE tags @> ARRAY['t3', 't7']) AS heap;
SELECT (SELECT count(*) FROM ix_g WHERE doc @> '{"n": 4}') AS gsnap_doc,
       (SELECT count(*) FROM ix_g WHERE body @@ to_tsquery('simple', 'word3')) AS gsnap_text;
EXPLAIN (COSTS OFF) SELECT id FROM ix_g ORDER BY pos <-> point(10, 10) LIMIT 3;
SELECT id FROM ix_g ORDER BY pos <-> point(10, 10), id LIMIT 3;
SELECT count(*) FROM ix_g WHERE span && int4range(100, 120);
EXPLAIN (COSTS OFF) SELECT count(*) FROM ix_g WHERE id BETWEEN 1000 AND 1100 AND k >= 0;
SELECT count(*) FROM ix_g WHERE id BETWEEN 1000 AND 1100;
SELECT count(*) FROM ix_g WHERE k = 7;
SELECT count(*) FROM ix_g WHERE k * 2 = 14 AND k < 50;
SELECT id FROM ix_g WHERE k = 3 AND id < 400 ORDER BY k, id;  -- index-only capable
RESET enable_seqscan;
RESET enable_bitmapscan;

-- Index maintenance under updates and deletes, then REINDEX (also concurrently)
SELECT on_both($$UPDATE %s SET k = k + 1, tags = tags || 'u'::text WHERE id % 3 = 0$$,
               'ix_h', 'ix_g');
SELECT on_both($$DELETE FROM %s WHERE id % 7 = 0$$, 'ix_h', 'ix_g');
REINDEX TABLE ix_g;
REINDEX TABLE CONCURRENTLY ix_g;
SET enable_seqscan = off;
SELECT (SELECT count(*) FROM ix_g WHERE tags @> ARRAY['u']) AS gsnap,
       (SELECT count(*) FROM ix_h WHERE tags @> ARRAY['u']) AS heap;
SELECT (SELECT array_agg(id ORDER BY id) FROM ix_g WHERE id BETWEEN 10 AND 30)
     = (SELECT array_agg(id ORDER BY id) FROM ix_h WHERE id BETWEEN 10 AND 30) AS same_ids;
RESET enable_seqscan;
SELECT same_rows('ix_h', 'ix_g');

-- A unique index is enforced
INSERT INTO ix_g (id) VALUES (1);
SET max_parallel_maintenance_workers = 0;  -- a deterministic first duplicate
CREATE UNIQUE INDEX CONCURRENTLY ix_g_k_unique ON ix_g (k);
RESET max_parallel_maintenance_workers;
SELECT indexrelid::regclass, indisvalid FROM pg_index WHERE indexrelid = 'ix_g_k_unique'::regclass;
DROP INDEX ix_g_k_unique;

DROP TABLE ix_h, ix_g;
