--
-- TOAST: large values on gsnap tables are stored out of line in a plain heap TOAST table
-- and read back intact, through updates, deletes, VACUUM and VACUUM FULL.
--
CREATE TABLE tt_g (id int PRIMARY KEY, t text, j jsonb, b bytea) USING gsnap;
SELECT a.amname AS toast_table_am
FROM pg_class c JOIN pg_class t ON t.oid = c.reltoastrelid JOIN pg_am a ON a.oid = t.relam
WHERE c.relname = 'tt_g';

-- compressible, incompressible, and jsonb values
INSERT INTO tt_g
SELECT i,
       repeat('compressible ', 10000),
       (SELECT jsonb_agg(jsonb_build_object('k', g, 'h', md5((i * g)::text)))
          FROM generate_series(1, 400) g),
       (SELECT string_agg(decode(md5((i + g)::text), 'hex'), ''::bytea)
          FROM generate_series(1, 1000) g)
FROM generate_series(1, 20) i;
SELECT id, length(t), jsonb_array_length(j), length(b),
       pg_column_size(t) < length(t) AS t_compressed
FROM tt_g WHERE id IN (1, 20) ORDER BY id;
SELECT pg_relation_size(reltoastrelid) > 0 AS toast_used FROM pg_class WHERE relname = 'tt_g';
-- checksums of every value, to compare after maintenance
CREATE TEMP TABLE tt_sums AS
SELECT id, md5(t) AS t, md5(j::text) AS j, md5(b) AS b FROM tt_g;

-- update the small part of the row: the TOAST pointers are kept
UPDATE tt_g SET id = id + 100 WHERE id <= 5;
-- update the large values
UPDATE tt_g SET t = t || 'changed' WHERE id BETWEEN 6 AND 10;
DELETE FROM tt_g WHERE id BETWEEN 11 AND 15;
VACUUM tt_g;
SELECT count(*) AS unchanged_rows FROM tt_g g JOIN tt_sums s
    ON s.id = CASE WHEN g.id > 100 THEN g.id - 100 ELSE g.id END
WHERE md5(g.t) = s.t AND md5(g.j::text) = s.j AND md5(g.b) = s.b;
SELECT id, right(t, 7) FROM tt_g WHERE id BETWEEN 6 AND 10 ORDER BY id;
VACUUM FULL tt_g;
SELECT count(*) AS rows, sum(length(t)) AS text_bytes, sum(length(b)) AS bytea_bytes FROM tt_g;
SELECT a.amname AS toast_table_am_after_vacuum_full
FROM pg_class c JOIN pg_class t ON t.oid = c.reltoastrelid JOIN pg_am a ON a.oid = t.relam
WHERE c.relname = 'tt_g';

-- a table created with CREATE TABLE AS and a large value
CREATE TABLE tt_ctas USING gsnap AS SELECT id, t FROM tt_g WHERE id > 100;
SELECT count(*), min(length(t)) FROM tt_ctas;

DROP TABLE tt_g, tt_ctas;
