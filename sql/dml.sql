--
-- DML on a gsnap table behaves exactly like on a heap table: the same statements give the
-- same results, the same rows at the same TIDs.
--
CREATE TABLE dml_h (id int PRIMARY KEY, k int, v text, j jsonb) USING heap
    WITH (autovacuum_enabled = off);
CREATE TABLE dml_g (LIKE dml_h INCLUDING ALL) USING gsnap;
SELECT c.relname, a.amname, c.reloptions FROM pg_class c JOIN pg_am a ON a.oid = c.relam
WHERE c.relname IN ('dml_h', 'dml_g') ORDER BY 1;

-- INSERT, INSERT ... SELECT, RETURNING
INSERT INTO dml_h VALUES (1, 10, 'a', '{"x": 1}') RETURNING *;
INSERT INTO dml_g VALUES (1, 10, 'a', '{"x": 1}') RETURNING *;
SELECT on_both($$INSERT INTO %s SELECT i, i % 7, md5(i::text), jsonb_build_object('i', i)
                 FROM generate_series(2, 2000) i$$, 'dml_h', 'dml_g');
SELECT same_rows('dml_h', 'dml_g');

-- COPY in and out
COPY dml_h FROM STDIN;
3001	1	copy-a	{"c": 1}
3002	2	copy-b	\N
\.
COPY dml_g FROM STDIN;
3001	1	copy-a	{"c": 1}
3002	2	copy-b	\N
\.
COPY (SELECT * FROM dml_g WHERE id > 3000 ORDER BY id) TO STDOUT;
SELECT same_rows('dml_h', 'dml_g');

-- INSERT ... ON CONFLICT
INSERT INTO dml_h VALUES (1, 99, 'dup', NULL) ON CONFLICT DO NOTHING RETURNING *;
INSERT INTO dml_g VALUES (1, 99, 'dup', NULL) ON CONFLICT DO NOTHING RETURNING *;
INSERT INTO dml_h VALUES (1, 99, 'dup', NULL), (4000, 1, 'new', NULL)
    ON CONFLICT (id) DO UPDATE SET k = excluded.k, v = dml_h.v || '+' RETURNING id, k, v;
INSERT INTO dml_g VALUES (1, 99, 'dup', NULL), (4000, 1, 'new', NULL)
    ON CONFLICT (id) DO UPDATE SET k = excluded.k, v = dml_g.v || '+' RETURNING id, k, v;
SELECT same_rows('dml_h', 'dml_g');
-- a duplicate key without ON CONFLICT fails the same way (and leaves the same dead tuple)
INSERT INTO dml_h VALUES (1, 0, 'x', NULL);
INSERT INTO dml_g VALUES (1, 0, 'x', NULL);

-- UPDATE: HOT (non-indexed column) and non-HOT (indexed column)
SELECT on_both($$UPDATE %s SET v = v || '!' WHERE id % 10 = 0$$, 'dml_h', 'dml_g');
SELECT on_both($$UPDATE %s SET id = id + 10000 WHERE id % 97 = 0$$, 'dml_h', 'dml_g');
SELECT on_both($$UPDATE %s SET j = j || '{"u": true}' WHERE k = 3$$, 'dml_h', 'dml_g');
SELECT same_rows('dml_h', 'dml_g');

-- DELETE, DELETE ... RETURNING, UPDATE ... FROM
DELETE FROM dml_h WHERE id BETWEEN 100 AND 110 RETURNING id;
DELETE FROM dml_g WHERE id BETWEEN 100 AND 110 RETURNING id;
SELECT on_both($$UPDATE %s t SET k = -1 FROM generate_series(1, 50) g WHERE t.id = g * 3$$,
               'dml_h', 'dml_g');
SELECT same_rows('dml_h', 'dml_g');

-- Row locks
BEGIN;
SELECT id, k FROM dml_g WHERE id IN (2, 3) ORDER BY id FOR UPDATE;
SELECT id FROM dml_g WHERE id = 4 FOR NO KEY UPDATE;
SELECT id FROM dml_g WHERE id = 5 FOR SHARE;
SELECT id FROM dml_g WHERE id = 6 FOR KEY SHARE;
SELECT locked_row FROM (SELECT ctid AS locked_row FROM dml_g WHERE id = 2) s;
COMMIT;
SELECT id FROM dml_g WHERE id = 7 FOR UPDATE SKIP LOCKED;
SELECT id FROM dml_g WHERE id = 8 FOR UPDATE NOWAIT;
SELECT same_rows('dml_h', 'dml_g');

-- Savepoints and rolled-back work
BEGIN;
SELECT on_both($$UPDATE %s SET k = 1000 WHERE id = 2$$, 'dml_h', 'dml_g');
SAVEPOINT s1;
SELECT on_both($$DELETE FROM %s WHERE id = 3$$, 'dml_h', 'dml_g');
ROLLBACK TO s1;
SELECT on_both($$INSERT INTO %s VALUES (5001, 1, 'sp', NULL)$$, 'dml_h', 'dml_g');
SAVEPOINT s2;
SELECT on_both($$UPDATE %s SET k = 2000 WHERE id = 4$$, 'dml_h', 'dml_g');
RELEASE s2;
ROLLBACK;
SELECT id, k FROM dml_g WHERE id IN (2, 3, 4, 5001) ORDER BY id;
SELECT same_rows('dml_h', 'dml_g');

-- Foreign keys (row locks taken by the RI triggers)
CREATE TABLE dml_child (id int PRIMARY KEY, parent int REFERENCES dml_g (id)) USING gsnap;
INSERT INTO dml_child VALUES (1, 2), (2, 5);
INSERT INTO dml_child VALUES (3, 999999);
DELETE FROM dml_g WHERE id = 2;
UPDATE dml_g SET v = 'parent ok' WHERE id = 5;
UPDATE dml_h SET v = 'parent ok' WHERE id = 5;

-- Triggers and a view over a gsnap table
CREATE FUNCTION dml_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.k := NEW.k + 1000; RETURN NEW; END $$;
CREATE TRIGGER dml_bump BEFORE INSERT ON dml_g FOR EACH ROW EXECUTE FUNCTION dml_bump();
INSERT INTO dml_g VALUES (7000, 1, 'trigger', NULL) RETURNING id, k;
CREATE VIEW dml_view AS SELECT id, k FROM dml_g WHERE k > 1000;
SELECT * FROM dml_view ORDER BY id;

-- Aggregates and sequential scans agree with heap (the FK and trigger tests touched only
-- the gsnap table, so from here on only the values are compared, not the TIDs)
SELECT on_both($$DELETE FROM %s WHERE id >= 7000$$, 'dml_h', 'dml_g');
DELETE FROM dml_child;
SELECT on_both($$DELETE FROM %s WHERE id = 2$$, 'dml_h', 'dml_g');
SELECT (SELECT count(*) FROM dml_h) AS heap_rows, (SELECT count(*) FROM dml_g) AS gsnap_rows,
       (SELECT sum(k) FROM dml_h) = (SELECT sum(k) FROM dml_g) AS same_sum;
SELECT same_values('dml_h', 'dml_g');

-- TABLESAMPLE reads heap pages too
SELECT count(*) > 0 AS sampled FROM dml_g TABLESAMPLE SYSTEM (50) REPEATABLE (1);

DROP VIEW dml_view;
DROP TABLE dml_child, dml_h, dml_g;
DROP FUNCTION dml_bump();
