"""The vector index in the fault-point matrices: one database on the session's server
(the embedded PostgreSQL with pgvector), snapshotted before each job of a chain and
restored from that snapshot before each point, and its state read back to compare.

A snapshot is a database of its own, made with ``CREATE DATABASE ... TEMPLATE``: a copy
of everything (tables, the ledger, the live views, the HNSW indexes) in one statement.
The state compared is what a re-run must reproduce: the catalogue and the ledger (less
their clocks), the live views and what they read, each table's rows (a digest of every
id and vector, in id order) and which indexes exist.
"""

from __future__ import annotations

import hashlib
import json

import psycopg
from psycopg import sql

from tests.conftest import database_url


class IndexSnapshots:
    """Database ``name`` on the server at ``admin_url`` and its snapshots."""

    def __init__(self, admin_url: str, name: str) -> None:
        self.admin_url, self.name = admin_url, name
        self.dsn = database_url(admin_url, name)
        self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}")

    def _admin(self, *statements: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def snapshot(self, label: str) -> None:
        snap = f"{self.name}_{label}"
        self._admin(
            f"DROP DATABASE IF EXISTS {snap} WITH (FORCE)",
            f"CREATE DATABASE {snap} TEMPLATE {self.name}",
        )

    def restore(self, label: str) -> None:
        snap = f"{self.name}_{label}"
        self._admin(
            f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)",
            f"CREATE DATABASE {self.name} TEMPLATE {snap}",
        )

    def state(self) -> dict[str, str]:
        """The index as the matrix compares it, keyed like store paths (``db:...``)."""
        with psycopg.connect(self.dsn) as conn:
            if not conn.execute("SELECT to_regnamespace('embedfresh') IS NOT NULL").fetchone()[0]:
                return {}
            out = {
                "db:tables": conn.execute(
                    "SELECT name, model, release, corpus, version, dim, id_type, "
                    "manifest_sha256, rows, indexed_at IS NOT NULL, ann::text "
                    "FROM embedfresh.tables ORDER BY name"
                ).fetchall(),
                "db:ledger": conn.execute(
                    "SELECT table_name, shard, sha256, rows FROM embedfresh.loaded_shards "
                    "ORDER BY table_name, shard"
                ).fetchall(),
                "db:changes": conn.execute(
                    "SELECT table_name, change_set, sha256, upserts, deletes "
                    "FROM embedfresh.applied_changes ORDER BY table_name, change_set"
                ).fetchall(),
                "db:live": conn.execute(
                    "SELECT model, corpus, table_name, view_name FROM embedfresh.live "
                    "ORDER BY model, corpus"
                ).fetchall(),
                "db:views": conn.execute(
                    "SELECT viewname, definition FROM pg_views WHERE schemaname = 'embedfresh' "
                    "ORDER BY viewname"
                ).fetchall(),
                "db:indexes": conn.execute(
                    "SELECT tablename, indexname FROM pg_indexes WHERE schemaname = 'embedfresh' "
                    "ORDER BY indexname"
                ).fetchall(),
            }
            for (name,) in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'embedfresh' AND c.relkind = 'r' AND c.relname LIKE 'emb\\_%' "
                "ORDER BY c.relname"
            ).fetchall():
                rows = conn.execute(
                    sql.SQL("SELECT id::text || ':' || embedding::text FROM {} ORDER BY id").format(
                        sql.Identifier("embedfresh", name)
                    )
                ).fetchall()
                digest = hashlib.sha256("\n".join(r[0] for r in rows).encode()).hexdigest()
                out[f"db:table:{name}"] = f"{len(rows)} rows {digest}"
        return {k: v if isinstance(v, str) else json.dumps(v, default=str) for k, v in out.items()}
