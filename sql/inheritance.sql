--
-- Table inheritance (INHERITS): a parent is read and restored alone, as FROM ONLY and COPY
-- do; a NOTICE says so when tables inherit from it. Its children are gsnap tables of their
-- own, read and restored by their own row types.
--
CREATE TABLE inh_par (id int, v text) USING gsnap;
CREATE TABLE inh_chi (extra int) INHERITS (inh_par) USING gsnap;
INSERT INTO inh_par VALUES (1, 'p1'), (2, 'p2');
INSERT INTO inh_chi SELECT g, 'c' || g, g * 10 FROM generate_series(10, 15) g;
SELECT gsnap_snapshot() AS s1 \gset

-- the live parent includes its child's rows; the snapshot of the parent is the parent alone
SELECT tableoid::regclass, id, v FROM inh_par ORDER BY id;
SELECT id, v FROM gsnap_asof(NULL::inh_par, :s1) ORDER BY id;
SELECT id, v, extra FROM gsnap_asof(NULL::inh_chi, :s1) ORDER BY id;
-- what a query of the parent as it was would return, written out
SELECT id, v FROM gsnap_asof(NULL::inh_par, :s1)
UNION ALL SELECT id, v FROM gsnap_asof(NULL::inh_chi, :s1) ORDER BY id;

-- in a session as of the snapshot, a query of the parent means its child's rows too: refused,
-- where FROM ONLY reads the parent's own rows
SET gsnap.as_of = :s1;
SELECT count(*) FROM inh_par;
SELECT count(*) FROM ONLY inh_par;
RESET gsnap.as_of;

-- the NOTICE comes once per query, when it is analyzed: not again when a prepared
-- statement runs
PREPARE inh_q(bigint) AS SELECT count(*) FROM gsnap_asof(NULL::inh_par, $1);
EXECUTE inh_q(:s1);
EXECUTE inh_q(:s1);
DEALLOCATE inh_q;

-- a child's rows are changed where they share TIDs with the parent's
INSERT INTO inh_par VALUES (3, 'p3');
UPDATE ONLY inh_par SET v = 'changed' WHERE id = 1;
UPDATE inh_chi SET v = 'child changed' WHERE id = 12;
SELECT gsnap_snapshot() AS s2 \gset
SELECT change, (rec).id, (rec).v FROM gsnap_diff(NULL::inh_par, :s1, :s2) ORDER BY 2, 1;
SELECT snap_id = :s2 AS at_s2, count(*) FROM gsnap_range(NULL::inh_par, :s1, :s2) GROUP BY 1 ORDER BY 1;
SELECT (rec).id, first_snap = :s1 AS from_s1, last_snap = :s2 AS to_s2
FROM gsnap_versions(NULL::inh_par, :s1, :s2) ORDER BY 1, 2;

-- restoring the parent puts back its own rows and leaves every row of the child as it is
-- (the child's rows at the TIDs of the parent's deleted rows included)
SELECT * FROM gsnap_restore('inh_par', :s1);
SELECT tableoid::regclass, id, v FROM inh_par ORDER BY id;
-- the child is restored by its own name
SELECT * FROM gsnap_restore('inh_chi', :s1);
SELECT tableoid::regclass, id, v FROM inh_par ORDER BY id;

-- no NOTICE once no table inherits from it, though the parent's flag stays set
ALTER TABLE inh_chi NO INHERIT inh_par;
SELECT relhassubclass FROM pg_class WHERE oid = 'inh_par'::regclass;
SELECT count(*) FROM gsnap_asof(NULL::inh_par, :s1);
-- a heap table inheriting from a gsnap table is named too
CREATE TABLE inh_heap () INHERITS (inh_par) USING heap;
SELECT count(*) FROM gsnap_asof(NULL::inh_par, :s1);
DROP TABLE inh_heap, inh_chi, inh_par;
