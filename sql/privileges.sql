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

-- a grant on some columns only is not enough; on every column it is
GRANT SELECT (id) ON pv TO pv_reader;
SET ROLE pv_reader;
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::pv, %s)', :s));
RESET ROLE;
GRANT SELECT (id, secret) ON pv TO pv_reader;
SET ROLE pv_reader;
SELECT * FROM gsnap_asof(NULL::pv, :s) ORDER BY id;
RESET ROLE;
REVOKE SELECT (id, secret) ON pv FROM pv_reader;
GRANT SELECT ON pv TO pv_reader;

-- row-level security: refused for roles the policies apply to, allowed for the owner
ALTER TABLE pv ENABLE ROW LEVEL SECURITY;
CREATE POLICY pv_only_visible ON pv FOR SELECT USING (secret = 'visible');
SET ROLE pv_reader;
SELECT * FROM pv;
SELECT sqlstate_of(format('SELECT * FROM gsnap_asof(NULL::pv, %s)', :s));
RESET ROLE;
SELECT count(*) AS owner_reads FROM gsnap_asof(NULL::pv, :s);

-- gsnap_admin members may declare snapshots
SET ROLE pv_admin;
SELECT gsnap_snapshot() > :s AS admin_can_snapshot;
RESET ROLE;

DROP TABLE pv;
DROP ROLE pv_reader;
REVOKE gsnap_admin FROM pv_admin;
DROP ROLE pv_admin;
