--
-- Dropped tables: a snapshot records what recreating each table needs; a table dropped since
-- is listed, read by the name it had then, and recreated (issue 10, point 2).
--
CREATE TABLE ud_orders (
    id serial PRIMARY KEY,
    code text NOT NULL COLLATE "C" UNIQUE,
    qty int DEFAULT 1 CHECK (qty > 0),
    gone int,
    doubled int GENERATED ALWAYS AS (qty * 2) STORED
) USING gsnap;
CREATE INDEX ud_orders_qty ON ud_orders (qty) WHERE qty > 10;
INSERT INTO ud_orders (code, qty, gone) SELECT 'c' || g, g, g FROM generate_series(1, 20) g;
ALTER TABLE ud_orders DROP COLUMN gone;
SELECT gsnap_snapshot() AS s \gset
DROP TABLE ud_orders;

SELECT table_name, dropped FROM gsnap_snapshot_tables(:s) WHERE table_name LIKE '%ud_orders';
SELECT gsnap_table_definition('ud_orders', :s);
SELECT count(*), sum(qty), max(code) FROM gsnap_asof_dropped('public.ud_orders', :s)
    AS t(id int, code text, qty int, doubled int);
-- the column definition list must match the recorded columns, and the hint says how
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof_dropped(''ud_orders'', %s) AS t(id int, code text)', :s));

SET client_min_messages = warning;
SELECT gsnap_undrop('ud_orders', :s);
RESET client_min_messages;
SELECT count(*), sum(doubled) FROM ud_orders;
INSERT INTO ud_orders (code) VALUES ('next') RETURNING id, qty, doubled;
SELECT indexrelid::regclass AS index FROM pg_index WHERE indrelid = 'ud_orders'::regclass ORDER BY 1;
-- the name is taken now: refused
SELECT sqlstate_of(format('SELECT gsnap_undrop(''ud_orders'', %s)', :s));
DROP TABLE ud_orders;
