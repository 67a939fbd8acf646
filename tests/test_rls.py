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

from cluster import gsnap_cluster, snapshot

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


def test_a_view_over_snapshots_reads_as_its_owner(cluster):
    """A view reads the tables it names with its owner's privileges and policies (PostgreSQL's
    rule, unless it is security_invoker): a role granted only the view reads AS OF through
    it what it read through the same view of the live table then."""
    with cluster.connect() as conn:
        for r in ("vw_owner", "vw_reader", "vw_cols", "vw_nobody"):
            conn.execute(f"CREATE ROLE {r} LOGIN")
        conn.execute("CREATE TABLE vdocs (id int PRIMARY KEY, region text, amount int) USING gsnap")
        conn.execute("INSERT INTO vdocs SELECT g, (ARRAY['eu','us'])[1 + g % 2], g FROM generate_series(1, 200) g")
        conn.execute("GRANT SELECT ON vdocs TO vw_owner")
        conn.execute("GRANT SELECT (id) ON vdocs TO vw_cols")
        conn.execute("ALTER TABLE vdocs ENABLE ROW LEVEL SECURITY")
        # The owner's policy decides what its views show; the reader's own would show all.
        conn.execute("CREATE POLICY eu ON vdocs FOR SELECT TO vw_owner USING (region = 'eu')")
        conn.execute("CREATE POLICY everything ON vdocs FOR SELECT TO vw_reader USING (true)")
        conn.execute("CREATE VIEW vd_live AS SELECT * FROM vdocs")
        conn.execute("ALTER VIEW vd_live OWNER TO vw_owner")
        conn.execute("GRANT SELECT ON vd_live TO vw_reader")
        then = as_role(conn, "vw_reader", "SELECT * FROM vd_live")
        s1 = snapshot(conn)
        conn.execute("UPDATE vdocs SET amount = amount * 10, region = 'eu' WHERE id % 3 = 0")
        conn.execute("DELETE FROM vdocs WHERE id % 7 = 0")
        later = as_role(conn, "vw_reader", "SELECT * FROM vd_live")
        s2 = snapshot(conn)
        assert 0 < len(then) < 200 and then != later
        views = {
            "vd_asof": f"SELECT * FROM gsnap_asof(NULL::vdocs, {s1})",
            "vd_range": f"SELECT snap_id, (rec).* FROM gsnap_range(NULL::vdocs, {s1}, {s2})",
            "vd_versions": f"SELECT (rec).* FROM gsnap_versions(NULL::vdocs, {s1}, {s2})",
            "vd_diff": f"SELECT change, (rec).* FROM gsnap_diff(NULL::vdocs, {s1}, {s2})",
            "vd_invoker": f"SELECT * FROM gsnap_asof(NULL::vdocs, {s1})",
            "vd_function": f"SELECT (gsnap_asof(NULL::vdocs, {s1})).*",
        }
        for name, query in views.items():
            invoker = " WITH (security_invoker)" if name == "vd_invoker" else ""
            conn.execute(f"CREATE VIEW {name}{invoker} AS {query}")
            conn.execute(f"ALTER VIEW {name} OWNER TO vw_owner")
            conn.execute(f"GRANT SELECT ON {name} TO vw_reader, vw_nobody")
        assert as_role(conn, "vw_reader", "SELECT * FROM vd_asof") == then
        rng = as_role(conn, "vw_reader", "SELECT * FROM vd_range")
        assert [r[1:] for r in rng if r[0] == s1] == then
        assert [r[1:] for r in rng if r[0] == s2] == later
        assert sorted(set(as_role(conn, "vw_reader", "SELECT * FROM vd_versions"))) == sorted(set(then) | set(later))
        diff = as_role(conn, "vw_reader", "SELECT * FROM vd_diff")
        assert [r[1:] for r in diff if r[0] == "added"] == sorted(set(later) - set(then))
        assert [r[1:] for r in diff if r[0] == "removed"] == sorted(set(then) - set(later))
        # The planned scans apply the owner's policies inside a role's own query too.
        assert as_role(conn, "vw_reader", "SELECT count(*) FROM vd_asof a JOIN vd_asof b USING (id)") == [(len(then),)]
        # A security_invoker view checks the reader, who may not read the table: refused, as
        # the function form (a reader outside FROM, checked as the current user) is.
        for name in ("vd_invoker", "vd_function"):
            conn.execute("SET ROLE vw_reader")
            try:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(f"SELECT * FROM {name}")
            finally:
                conn.execute("RESET ROLE")
        # A role granted the view but not the table reads it as the owner would: the same rows.
        assert as_role(conn, "vw_nobody", "SELECT * FROM vd_asof") == then
        # Column grants of the owner: a view of the granted column reads, one of another not.
        conn.execute(f"CREATE VIEW vd_ids AS SELECT id FROM gsnap_asof(NULL::vdocs, {s1})")
        conn.execute(f"CREATE VIEW vd_amounts AS SELECT amount FROM gsnap_asof(NULL::vdocs, {s1})")
        conn.execute("ALTER TABLE vdocs DISABLE ROW LEVEL SECURITY")
        for name in ("vd_ids", "vd_amounts"):
            conn.execute(f"ALTER VIEW {name} OWNER TO vw_cols")
            conn.execute(f"GRANT SELECT ON {name} TO vw_reader")
        assert len(as_role(conn, "vw_reader", "SELECT * FROM vd_ids")) == 200
        conn.execute("SET ROLE vw_reader")
        try:
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
                conn.execute("SELECT * FROM vd_amounts")
            assert "amount" in (e.value.diag.message_detail or "")
        finally:
            conn.execute("RESET ROLE")
        # The range aggregate node (no row security now) checks the owner too.
        conn.execute(f"CREATE VIEW vd_sums AS SELECT snap_id, sum((rec).amount) FROM "
                     f"gsnap_range(NULL::vdocs, {s1}, {s2}) GROUP BY snap_id")
        conn.execute("ALTER VIEW vd_sums OWNER TO vw_owner")
        conn.execute("GRANT SELECT ON vd_sums TO vw_reader")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (COSTS OFF) SELECT * FROM vd_sums"))
        assert "gsnap range aggregate" in plan
        truth = sorted(conn.execute(f"SELECT snap_id, sum((rec).amount) FROM gsnap_range(NULL::vdocs, {s1}, {s2}) "
                                    "GROUP BY 1 ORDER BY 1").fetchall())
        # A prepared statement over the view follows its owner: replanned when it changes.
        conn.execute("SET ROLE vw_reader")
        try:
            conn.execute("PREPARE sums AS SELECT * FROM vd_sums")
            assert sorted(conn.execute("EXECUTE sums").fetchall()) == truth
            conn.execute("RESET ROLE")
            conn.execute("ALTER VIEW vd_sums OWNER TO vw_nobody")
            conn.execute("SET ROLE vw_reader")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("EXECUTE sums")
        finally:
            conn.execute("RESET ROLE")
            conn.execute("DEALLOCATE ALL")
