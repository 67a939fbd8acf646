"""pytest fixtures: one shared gsnap cluster for the tests that can share it, and the crash
guard every test runs under."""

import pytest

from cluster import Cluster


@pytest.fixture(scope="session")
def cluster():
    c = Cluster("pytest").start()
    with c.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS gsnap")
    yield c
    c.destroy()


@pytest.fixture
def conn(cluster):
    with cluster.connect() as c:
        yield c


@pytest.fixture(autouse=True)
def no_unexpected_crash():
    """After each test, every running cluster's log must be free of crashes no test asked for
    (`Cluster.unexpected_crashes`). A crash that happens as a test ends may be reported by the
    next one: the message says which cluster and what its log said."""
    yield
    found = {c: c.unexpected_crashes() for c in list(Cluster.live)}
    found = {c: lines for c, lines in found.items() if lines}
    if found:
        pytest.fail("a server process crashed during this test (or just before it):\n" + "\n".join(
            f"{c.base}:\n  " + "\n  ".join(lines) for c, lines in found.items()), pytrace=False)
