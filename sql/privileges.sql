--
-- Reading a table as of a snapshot needs the privileges reading it now needs; declaring
-- snapshots is for superusers and gsnap_admin.
--
CREATE TABLE pv (id int, secret text) USING gsnap;
INSERT INTO pv VALUES (1, 'hidden'), (2, 'visible');
SELECT gsnap_snapshot() AS s \gset
CREATE ROLE pv_reader LOGIN;
CREATE ROLE pv_admin LOGIN;
GRANT gsnap_admin TO pv_admin;

SET ROLE pv_reader;
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::pv, %s)', :s));
SELECT sqlstate_of('SELECT gsnap_snapshot()');
SELECT sqlstate_of('SELECT * FROM gsnap_debug_snapshot()');
-- listing snapshots is allowed (it shows table names, as pg_class does)
SELECT count(*) > 0 AS can_list FROM gsnap_snapshots();
RESET ROLE;

-- a grant on some columns lets a query read those columns AS OF, as it does now; a query
-- that reads another one (output, condition, sub-query), or whole rows (a whole-row
-- reference, rec itself, gsnap_diff's rec), is refused
GRANT SELECT (id) ON pv TO pv_reader;
SET ROLE pv_reader;
SELECT id FROM pv ORDER BY id;
SELECT id FROM gsnap_asof(NULL::pv, :s) ORDER BY id;
SELECT count(*) AS counted FROM gsnap_asof(NULL::pv, :s);
SELECT a.id FROM gsnap_asof(NULL::pv, :s) a JOIN pv USING (id) WHERE a.id > 1;
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::pv, %s)', :s));
SELECT sqlstate_of(format('SELECT secret FROM gsnap_asof(NULL::pv, %s)', :s));
SELECT sqlstate_of(format('SELECT id FROM gsnap_asof(NULL::pv, %s) WHERE secret = %L', :s, 'hidden'));
SELECT sqlstate_of(format('SELECT id, (SELECT a.secret) FROM gsnap_asof(NULL::pv, %s) a', :s));
SELECT sqlstate_of(format('SELECT a.id FROM gsnap_asof(NULL::pv, %s) a JOIN pv b ON a.secret = b.id::text', :s));
SELECT sqlstate_of(format('SELECT a.id, l.x FROM gsnap_asof(NULL::pv, %s) a, LATERAL (SELECT a.secret AS x) l', :s));
SELECT sqlstate_of(format('SELECT id FROM gsnap_asof(NULL::pv, %s) ORDER BY secret', :s));
SELECT sqlstate_of(format('SELECT a FROM gsnap_asof(NULL::pv, %s) a', :s));
-- over a range: the fields of rec the query selects are the columns it reads
SELECT (rec).id FROM gsnap_range(NULL::pv, :s, :s) ORDER BY 1;
SELECT (rec).id FROM gsnap_versions(NULL::pv, :s, :s) WHERE (rec).id > 1;
SELECT count(*) AS counted FROM gsnap_range(NULL::pv, :s, :s) GROUP BY snap_id;
SELECT sqlstate_of(format('SELECT (rec).* FROM gsnap_range(NULL::pv, %s, %s)', :s, :s));
SELECT sqlstate_of(format('SELECT rec FROM gsnap_range(NULL::pv, %s, %s)', :s, :s));
SELECT sqlstate_of(format('SELECT (rec).id FROM gsnap_range(NULL::pv, %s, %s) WHERE (rec).secret > %L', :s, :s, 'a'));
SELECT sqlstate_of(format('SELECT (rec).id FROM gsnap_versions(NULL::pv, %s, %s) ORDER BY (rec).secret', :s, :s));
SELECT sqlstate_of(format('SELECT (SELECT (g.rec).secret) FROM gsnap_range(NULL::pv, %s, %s) g', :s, :s));
SELECT sqlstate_of(format('SELECT l.x FROM gsnap_range(NULL::pv, %s, %s) g, LATERAL (SELECT (g.rec).secret AS x OFFSET 0) l', :s, :s));
SELECT sqlstate_of(format('SELECT count(*) FROM gsnap_range(NULL::pv, %s, %s) g WHERE row_to_json(g.rec) IS NOT NULL', :s, :s));
SELECT sqlstate_of(format('SELECT change, (rec).id FROM gsnap_diff(NULL::pv, %s, %s)', :s, :s));
SELECT sqlstate_of(format('SELECT change, (rec).secret FROM gsnap_diff(NULL::pv, %s, %s)', :s, :s));
SELECT sqlstate_of(format('SELECT gsnap_diff(NULL::pv, %s, %s)', :s, :s));
RESET ROLE;
GRANT SELECT (id, secret) ON pv TO pv_reader;
SET ROLE pv_reader;
SELECT * FROM gsnap_asof(NULL::pv, :s) ORDER BY id;
RESET ROLE;
REVOKE SELECT (id, secret) ON pv FROM pv_reader;
GRANT SELECT ON pv TO pv_reader;

-- row-level security: the policies that apply to a role now are applied to the old rows of
-- an AS OF, range or versions scan (whole rows too), before the query's own conditions;
-- function scans and policies with sub-queries are refused; the owner reads everything
ALTER TABLE pv ENABLE ROW LEVEL SECURITY;
CREATE POLICY pv_only_visible ON pv FOR SELECT USING (secret = 'visible');
UPDATE pv SET secret = 'hidden now' WHERE id = 2;  -- the snapshot still has 'visible'
SELECT gsnap_snapshot() AS s2 \gset
CREATE FUNCTION pv_leak(text) RETURNS bool LANGUAGE plpgsql COST 0.0000001 AS
    $$ BEGIN RAISE NOTICE 'leak saw %', $1; RETURN true; END $$;
GRANT EXECUTE ON FUNCTION pv_leak(text) TO pv_reader;
PREPARE pv_asof AS SELECT * FROM gsnap_asof(NULL::pv, :s) ORDER BY id;
EXECUTE pv_asof;
SET ROLE pv_reader;
SELECT * FROM pv;
SELECT * FROM gsnap_asof(NULL::pv, :s) ORDER BY id;
SELECT id FROM gsnap_asof(NULL::pv, :s) WHERE pv_leak(secret);
EXECUTE pv_asof;  -- planned for the owner: planned again for this role
SELECT a FROM gsnap_asof(NULL::pv, :s) a;  -- whole rows too
-- ranges and versions check the policies on each row version's fields, in their Row Filter
SELECT snap_id = :s AS at_s, (rec).* FROM gsnap_range(NULL::pv, :s, :s) ORDER BY 2;
SELECT (rec).id FROM gsnap_range(NULL::pv, :s, :s) WHERE pv_leak((rec).secret);
SELECT first_snap = :s AS at_s, (rec).* FROM gsnap_versions(NULL::pv, :s, :s);
SELECT snap_id = :s AS at_s, count(*) FROM gsnap_range(NULL::pv, :s, :s) GROUP BY snap_id;
EXPLAIN (COSTS OFF) SELECT (rec).id FROM gsnap_range(NULL::pv, 1, 2);
-- a diff too, on each row of either side
SELECT change, (rec).* FROM gsnap_diff(NULL::pv, :s, :s2) ORDER BY 2;
-- a function scan has no place for them
SELECT sqlstate_of(format('SELECT * FROM gsnap_range(NULL::pv, %s, %s) WITH ORDINALITY', :s, :s));
SELECT sqlstate_of(format('SELECT gsnap_diff(NULL::pv, %s, %s)', :s, :s));
SET row_security = off;
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::pv, %s)', :s));
RESET row_security;
RESET ROLE;
CREATE POLICY pv_sub ON pv AS RESTRICTIVE FOR SELECT USING (id IN (SELECT 1));
SET ROLE pv_reader;
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::pv, %s)', :s));
RESET ROLE;
DROP POLICY pv_sub ON pv;
SELECT count(*) AS owner_reads FROM gsnap_asof(NULL::pv, :s);
DEALLOCATE pv_asof;
DROP FUNCTION pv_leak(text);

-- gsnap_admin members may declare snapshots
SET ROLE pv_admin;
SELECT gsnap_snapshot() > :s AS admin_can_snapshot;
RESET ROLE;

DROP TABLE pv;
DROP ROLE pv_reader;
REVOKE gsnap_admin FROM pv_admin;
DROP ROLE pv_admin;
