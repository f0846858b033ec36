"""The golden run: ``dag.test()`` of ``dags/embedding_model_refresh.py`` on the local
runner, made once per test session (once per pytest-xdist worker that needs it) and
shared by the tests that assert on a whole refresh rather than re-running it.

It runs exactly as tests/test_dags.py runs the refresh (:func:`tests.test_dags.run_dag`:
its case's data, conf and logical date, a fresh AIRFLOW_HOME, the generated data set in a
private ``file://`` store), with its vector index in a database of its own on the
session's PostgreSQL (``EMBEDFRESH_INDEX_DSN``, as production names it), so that runs
elsewhere (the Batch refresh, tests/test_refresh_on_batch.py) compare their XComs with it.

Users read it and never write it: the ``golden_refresh`` fixture (tests/conftest.py)
hands each test a copy of the run's facts and, after the test, fails it if the store or
the index database changed. A test that needs to write copies the store first.
"""

from __future__ import annotations

import copy
import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from embedfresh.core.settings import INDEX_DSN_ENV
from tests.conftest import database_url, files_sha256
from tests.test_dags import GOLDEN_LABEL, SOURCES, DagSource, Run, run_dag

#: The refresh DAG file among tests/test_dags.py's sources.
REFRESH: DagSource = next(s for s in SOURCES if s.label == GOLDEN_LABEL)


def fresh_database(pg_server: str, name: str) -> str:
    """A new, empty database on the session's index server: its URL."""
    import psycopg

    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    return database_url(pg_server, name)


@dataclass(frozen=True)
class Golden:
    """The session's refresh: the run, and the index database it loaded."""

    run: Run
    database: str
    """Its database's name on the session's server (what XComs name, to normalise)."""
    dsn: str
    """That database's URL: ``EMBEDFRESH_INDEX_DSN`` of the run, and of a test reading
    its index (``open_index``)."""
    digest: str = field(default="", compare=False)
    """:func:`digest` right after the run."""

    def copy(self) -> Golden:
        """The same run with facts of its own: a user may change its copy freely."""
        return replace(self, run=replace(self.run, facts=copy.deepcopy(self.run.facts)))


def build(path: Path, pg_server: str, request: pytest.FixtureRequest) -> Golden:
    """Run the refresh under ``path`` on the local runner, its index the new database
    ``golden_<worker>`` of ``pg_server``; fails unless the run succeeded."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"golden_{worker}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    dsn = fresh_database(pg_server, name)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(INDEX_DSN_ENV, dsn)
        # The local runner, whatever a test around a lazy first use has set.
        for var in ("EMBEDFRESH_EXECUTION_MODE", "EMBEDFRESH_EMBED_FAN_OUT"):
            env.delenv(var, raising=False)
        run = run_dag(REFRESH, path, request)
    assert run.facts["state"] == "success", run.output
    golden = Golden(run, name, dsn)
    return replace(golden, digest=digest(golden))


def digest(golden: Golden) -> str:
    """What a user must not change: every file of the store (path and bytes) and every
    table of the index database (name and rows)."""
    import psycopg
    from psycopg import sql

    h = hashlib.sha256()
    for name, sha in files_sha256(golden.run.artifacts).items():
        h.update(f"{name}={sha}\0".encode())
    with psycopg.connect(golden.dsn, autocommit=True) as db:
        tables = db.execute(
            "SELECT n.nspname, c.relname FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p')"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " ORDER BY 1, 2"
        ).fetchall()
        for schema, table in tables:
            query = sql.SQL("SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM {}.{} t")
            (rows,) = db.execute(
                query.format(sql.Identifier(schema), sql.Identifier(table))
            ).fetchone()
            h.update(f"{schema}.{table}={rows}\0".encode())
    return h.hexdigest()


def assert_unchanged(golden: Golden) -> None:
    """Fails the test that wrote to the golden run's store or index."""
    assert digest(golden) == golden.digest, (
        "a test changed the session's golden run (tests/golden.py): its store under "
        f"{golden.run.root} or its index database {golden.database}; copy it to write"
    )
