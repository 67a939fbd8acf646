"""pytest fixtures: one shared gsnap cluster for the tests that can share it."""

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
