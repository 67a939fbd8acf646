"""Row-level security and column privileges over snapshots (issue 10, point 4).

Differential: for each role, what it reads of the live table at the moment of a snapshot
(policies applied by PostgreSQL) must equal what it reads later AS OF that snapshot, after
the rows changed (policies applied by gsnap to the old rows): permissive policies OR-ed,
restrictive ones AND-ed, policies on current_user, FORCE ROW LEVEL SECURITY for the owner,
BYPASSRLS, no policy for a role (no row). The same through gsnap_range, gsnap_versions and
gsnap_diff.
Column grants: the columns a role may read, AS OF and over a range, and nothing more.
"""

import psycopg
import pytest

from cluster import gsnap_cluster

ROLES = ["alice", "bob", "carol", "auditor"]


@pytest.fixture(scope="module")
def cluster():
    yield from gsnap_cluster("rls")


def as_role(conn, role: str, query: str) -> list:
    conn.execute(f"SET ROLE {role}")
    try:
        return sorted(conn.execute(query).fetchall())
    finally:
        conn.execute("RESET ROLE")


def test_each_role_reads_as_of_what_it_read_then(cluster):
    with cluster.connect() as conn:
        conn.execute("CREATE ROLE rls_owner LOGIN")
        for r in ROLES:
            conn.execute(f"CREATE ROLE {r} LOGIN")
        conn.execute("ALTER ROLE auditor BYPASSRLS")
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, owner text, region text, public bool, body text) "
                     "USING gsnap")
        conn.execute("ALTER TABLE docs OWNER TO rls_owner")
        conn.execute("GRANT SELECT ON docs TO alice, bob, carol, auditor")
        conn.execute("""INSERT INTO docs SELECT g, (ARRAY['alice','bob','rls_owner'])[1 + g % 3],
                        (ARRAY['eu','us'])[1 + g % 2], g % 5 = 0, 'body ' || g FROM generate_series(1, 300) g""")
        conn.execute("ALTER TABLE docs ENABLE ROW LEVEL SECURITY")
        conn.execute("ALTER TABLE docs FORCE ROW LEVEL SECURITY")
        conn.execute("CREATE POLICY mine ON docs FOR SELECT USING (owner = current_user)")
        conn.execute("CREATE POLICY shared ON docs FOR SELECT TO alice, rls_owner USING (public)")
        conn.execute("CREATE POLICY eu_only ON docs AS RESTRICTIVE FOR SELECT TO bob, rls_owner USING (region = 'eu')")
        everyone = ROLES + ["rls_owner"]
        then = {r: as_role(conn, r, "SELECT * FROM docs") for r in everyone}
        snap = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        # The rows change: contents, owners, regions; some go, some come.
        conn.execute("UPDATE docs SET owner = 'bob', region = 'us' WHERE id % 7 = 0")
        conn.execute("UPDATE docs SET public = NOT public, body = body || '!' WHERE id % 4 = 0")
        conn.execute("DELETE FROM docs WHERE id % 11 = 0")
        conn.execute("INSERT INTO docs SELECT g, 'alice', 'eu', true, 'new' FROM generate_series(301, 330) g")
        snap2 = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        later = {r: as_role(conn, r, "SELECT * FROM docs") for r in everyone}
        for r in everyone:
            asof = as_role(conn, r, f"SELECT * FROM gsnap_asof(NULL::docs, {snap})")
            assert asof == then[r], r
            whole = as_role(conn, r, f"SELECT d FROM gsnap_asof(NULL::docs, {snap}) d")
            assert len(whole) == len(then[r]), r
            # Over a range: each snapshot's rows are what the role read then.
            rng = as_role(conn, r, f"SELECT snap_id, (rec).* FROM gsnap_range(NULL::docs, {snap}, {snap2})")
            assert [row[1:] for row in rng if row[0] == snap] == then[r], r
            assert [row[1:] for row in rng if row[0] == snap2] == later[r], r
            versions = as_role(conn, r, f"SELECT (rec).* FROM gsnap_versions(NULL::docs, {snap}, {snap2})")
            assert sorted(set(versions)) == sorted(set(then[r]) | set(later[r])), r
            # A diff shows the rows the role could see on either side, and only those.
            diff = as_role(conn, r, f"SELECT change, (rec).* FROM gsnap_diff(NULL::docs, {snap}, {snap2})")
            assert [row[1:] for row in diff if row[0] == "added"] == sorted(set(later[r]) - set(then[r])), r
            assert [row[1:] for row in diff if row[0] == "removed"] == sorted(set(then[r]) - set(later[r])), r
        # Carol has no policy: no row (PostgreSQL's default deny); the auditor bypasses them.
        assert then["carol"] == [] and len(then["auditor"]) == 300
        assert 0 < len(then["bob"]) < len(then["alice"]) < 300
        # FORCE: the owner is subject to its policies too.
        assert len(then["rls_owner"]) < 300


def test_column_grants_read_only_their_columns(cluster):
    with cluster.connect() as conn:
        conn.execute("CREATE ROLE colreader LOGIN")
        conn.execute("CREATE TABLE pay (id int PRIMARY KEY, name text, salary int) USING gsnap")
        conn.execute("INSERT INTO pay SELECT g, 'n' || g, g * 1000 FROM generate_series(1, 50) g")
        conn.execute("GRANT SELECT (id, name) ON pay TO colreader")
        snap = conn.execute("SELECT gsnap_snapshot()").fetchone()[0]
        conn.execute("UPDATE pay SET name = 'renamed'")
        allowed = [
            f"SELECT id, name FROM gsnap_asof(NULL::pay, {snap})",
            f"SELECT count(*) FROM gsnap_asof(NULL::pay, {snap}) WHERE name LIKE 'n%'",
            f"SELECT snap_id, (rec).name FROM gsnap_range(NULL::pay, {snap}, {snap}) WHERE (rec).id < 10",
            f"SELECT first_snap, (rec).id FROM gsnap_versions(NULL::pay, {snap}, {snap})",
            f"SELECT change, (rec).id, (rec).name FROM gsnap_diff(NULL::pay, {snap}, {snap})",
        ]
        refused = [
            f"SELECT * FROM gsnap_asof(NULL::pay, {snap})",
            f"SELECT id FROM gsnap_asof(NULL::pay, {snap}) WHERE salary > 10",
            f"SELECT id FROM gsnap_asof(NULL::pay, {snap}) ORDER BY salary",
            f"SELECT sum(salary) FROM gsnap_asof(NULL::pay, {snap})",
            f"SELECT (rec).salary FROM gsnap_range(NULL::pay, {snap}, {snap})",
            f"SELECT snap_id, sum((rec).salary) FROM gsnap_range(NULL::pay, {snap}, {snap}) GROUP BY 1",
            f"SELECT rec FROM gsnap_versions(NULL::pay, {snap}, {snap})",
            f"SELECT * FROM gsnap_diff(NULL::pay, {snap}, {snap})",
            f"SELECT change FROM gsnap_diff(NULL::pay, {snap}, {snap}) WHERE (rec).salary > 0",
            f"SELECT change, rec FROM gsnap_diff(NULL::pay, {snap}, {snap})",
        ]
        with cluster.connect(user="colreader") as r:
            assert len(r.execute(allowed[0]).fetchall()) == 50
            assert r.execute(allowed[1]).fetchone()[0] == 50
            assert len(r.execute(allowed[2]).fetchall()) == 9
            assert len(r.execute(allowed[3]).fetchall()) == 50
            assert r.execute(allowed[4]).fetchall() == []
            for q in refused:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    r.execute(q)
            # The message names the column.
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
                r.execute(refused[1])
            assert "salary" in (e.value.diag.message_detail or "")
