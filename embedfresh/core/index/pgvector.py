"""The vector index on PostgreSQL with pgvector: :class:`PgVectorIndex`.

Everything lives in the schema ``embedfresh``:

- one table per release and corpus (:func:`~embedfresh.core.index.base.table_name`):
  ``id bigint|text PRIMARY KEY, embedding vector(dim)``, an HNSW index
  (``vector_cosine_ops``) built once every shard is in;
- ``embedfresh.tables``: the catalogue of the tables the index made (model, release,
  corpus, version, dimension, id type, the manifest whose vectors it holds), so a table
  of the same name that the catalogue does not know is *foreign* and never touched;
- ``embedfresh.loaded_shards``: the ledger, one row per shard loaded, written in the
  transaction that COPYs the shard's rows: a re-run after a kill loads only what the
  ledger lacks, and the table ends with every corpus id exactly once (its primary key
  refuses a second);
- ``embedfresh.applied_changes``: the corpus change sets applied to a table
  (:mod:`embedfresh.core.changes`), each recorded in the transaction that writes its
  upserts and deletes: a re-run of the corpus sync applies only what it lacks;
- ``embedfresh.live``: per model and corpus, the table its live view
  (:func:`~embedfresh.core.index.base.live_view_name`: ``id, embedding, release,
  version``) reads; the view is replaced in the same transaction, so a reader sees the
  old view or the new, never none, and each row says which model its vector is of.

Rows go in with binary COPY through psycopg and pgvector's type adapters. A connection
that fails or is lost (the server stopped, the network dropped) raises
:class:`~embedfresh.core.exit_codes.TransientError`: exit 75, and the re-run resumes from
the ledger. Connection strings never reach a log or a record: :attr:`location` is the
server without its credentials.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from embedfresh.core.exit_codes import BadInputError, TransientError
from embedfresh.core.index.base import (
    AnnSettings,
    AppliedChange,
    LiveState,
    SearchResult,
    ShardLoad,
    TableInfo,
    TableSpec,
    VectorIndex,
    check_vectors,
    live_view_name,
)
from embedfresh.core.storage import faults

log = logging.getLogger(__name__)

SCHEMA = "embedfresh"

_BOOTSTRAP = """
CREATE EXTENSION IF NOT EXISTS vector;
CREATE SCHEMA IF NOT EXISTS embedfresh;
CREATE TABLE IF NOT EXISTS embedfresh.tables (
    name text PRIMARY KEY,
    model text NOT NULL,
    release text NOT NULL,
    corpus text NOT NULL,
    version text NOT NULL,
    dim integer NOT NULL,
    id_type text NOT NULL,
    manifest_sha256 text NOT NULL,
    rows bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    indexed_at timestamptz,
    ann jsonb
);
CREATE TABLE IF NOT EXISTS embedfresh.loaded_shards (
    table_name text NOT NULL REFERENCES embedfresh.tables (name) ON DELETE CASCADE,
    shard text NOT NULL,
    sha256 text NOT NULL,
    rows bigint NOT NULL,
    loaded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, shard)
);
CREATE TABLE IF NOT EXISTS embedfresh.applied_changes (
    table_name text NOT NULL REFERENCES embedfresh.tables (name) ON DELETE CASCADE,
    change_set text NOT NULL,
    sha256 text NOT NULL,
    upserts bigint NOT NULL,
    deletes bigint NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, change_set)
);
CREATE TABLE IF NOT EXISTS embedfresh.live (
    model text NOT NULL,
    corpus text NOT NULL,
    table_name text NOT NULL REFERENCES embedfresh.tables (name),
    view_name text NOT NULL,
    switched_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, corpus)
);
CREATE SEQUENCE IF NOT EXISTS embedfresh.live_generation;
-- Columns added since the first schema, each only where it is missing: ALTER TABLE takes
-- its table's exclusive lock before IF NOT EXISTS looks, and every connection runs this.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'embedfresh'
                   AND table_name = 'live' AND column_name = 'generation') THEN
        ALTER TABLE embedfresh.live ADD COLUMN generation bigint NOT NULL DEFAULT 0;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'embedfresh'
                   AND table_name = 'applied_changes' AND column_name = 'etag') THEN
        ALTER TABLE embedfresh.applied_changes ADD COLUMN etag text;
    END IF;
END
$$
"""

_SQL_TYPES = {"int64": "bigint", "string": "text"}
_COPY_TYPES = {"int64": "int8", "string": "text"}


def _translate(method: Callable) -> Callable:
    """A lost or refused connection is transient (exit 75); the rest is as raised."""

    @functools.wraps(method)
    def wrapper(self: PgVectorIndex, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (psycopg.OperationalError, psycopg.InterfaceError) as e:
            raise TransientError(f"vector index {self.location} unreachable: {_one_line(e)}") from e

    return wrapper


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def redacted(dsn: str) -> str:
    """``postgresql://user@host:port/db``: a connection string without its password or
    other options, fit for a log line or a release record."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "postgresql://<unparsable connection string>"
    host = parts.get("host") or "localhost"
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{host}{port}/{parts.get('dbname') or ''}"


def _ident(name: str) -> sql.Composed:
    return sql.Identifier(SCHEMA, name)


class PgVectorIndex(VectorIndex):
    """A :class:`VectorIndex` on one PostgreSQL database with the pgvector extension.

    :param dsn: a libpq connection string or URL (never logged).
    :param location: what :attr:`location` says instead of the redacted DSN (the
        embedded server says where its data is).
    :param on_close: called once after the connection closes (the embedded server's
        release).
    """

    kind = "pgvector"

    def __init__(
        self,
        dsn: str,
        *,
        location: str | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._location = location or redacted(dsn)
        self._on_close = on_close
        self._conn = self._connect(dsn)

    @property
    def location(self) -> str:
        return self._location

    @_translate
    def _connect(self, dsn: str) -> psycopg.Connection:
        conn = psycopg.connect(
            dsn, autocommit=True, connect_timeout=20, application_name="embedfresh"
        )
        try:
            with conn.transaction():
                # Two first loads at once must not race on CREATE ... IF NOT EXISTS.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('embedfresh.bootstrap'))")
                conn.execute(_BOOTSTRAP)
            register_vector(conn)
        except psycopg.errors.InsufficientPrivilege as e:
            conn.close()
            raise BadInputError(
                f"vector index {self._location}: the user may not create the vector extension "
                f"or the {SCHEMA} schema ({_one_line(e)}): run CREATE EXTENSION vector and "
                f"CREATE SCHEMA {SCHEMA} as an owner once"
            ) from e
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        if self._conn is None:
            return
        try:
            self._conn.close()
        finally:
            self._conn = None
            if self._on_close is not None:
                self._on_close()

    # -- tables ----------------------------------------------------------------------

    @_translate
    def prepare_table(self, spec: TableSpec) -> None:
        conn = self._conn
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"table:{spec.name}",))
            row = conn.execute(
                "SELECT model, release, corpus, version, dim, id_type, manifest_sha256, rows "
                "FROM embedfresh.tables WHERE name = %s",
                (spec.name,),
            ).fetchone()
            exists = self._exists(spec.name)
            where = f"{SCHEMA}.{spec.name} in {self.location}"
            if row is None and exists:
                raise BadInputError(
                    f"table {where} exists but this index did not make it (it is not in "
                    f"{SCHEMA}.tables): refusing to load into or drop a foreign table; rename "
                    "or drop it yourself if it is not needed"
                )
            if row is not None:
                recorded = dict(
                    zip(
                        ("model", "release", "corpus", "version", "dim", "id_type",
                         "manifest_sha256", "rows"),
                        row,
                        strict=True,
                    )
                )  # fmt: skip
                wanted = {k: getattr(spec, k) for k in recorded}
                differ = [f"{k} {recorded[k]!r} (this load: {wanted[k]!r})"
                          for k in recorded if recorded[k] != wanted[k]]  # fmt: skip
                if differ:
                    raise BadInputError(
                        f"table {where} holds other vectors: {'; '.join(differ)}; nothing was "
                        "dropped (a release's table is never overwritten)"
                    )
                if exists:
                    self._check_columns(spec)
                    return
                # Catalogued but gone (dropped by hand): start it again from an empty ledger.
                log.warning("table %s is catalogued but missing: creating it again", where)
                conn.execute("DELETE FROM embedfresh.loaded_shards WHERE table_name = %s",
                             (spec.name,))  # fmt: skip
            else:
                conn.execute(
                    "INSERT INTO embedfresh.tables (name, model, release, corpus, version, dim, "
                    "id_type, manifest_sha256, rows) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (spec.name, spec.model, spec.release, spec.corpus, spec.version, spec.dim,
                     spec.id_type, spec.manifest_sha256, spec.rows),
                )  # fmt: skip
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (id {} PRIMARY KEY, embedding vector({}) NOT NULL)"
                ).format(
                    _ident(spec.name), sql.SQL(_SQL_TYPES[spec.id_type]), sql.Literal(spec.dim)
                )
            )
        log.info("created table %s.%s (%d dimensions, %s ids)", SCHEMA, spec.name, spec.dim,
                 spec.id_type)  # fmt: skip

    def _exists(self, table: str) -> bool:
        found = self._conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f'{SCHEMA}."{table}"',)
        ).fetchone()
        return bool(found[0])

    def _check_columns(self, spec: TableSpec) -> None:
        """The table's columns as this index makes them: a table altered by hand is foreign."""
        columns = dict(
            self._conn.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
                (f'{SCHEMA}."{spec.name}"',),
            ).fetchall()
        )
        wanted = {"id": _SQL_TYPES[spec.id_type], "embedding": f"vector({spec.dim})"}
        if columns != wanted:
            raise BadInputError(
                f"table {SCHEMA}.{spec.name} in {self.location} has columns {columns}, not "
                f"{wanted}: it was changed outside embedfresh; nothing was dropped"
            )

    @_translate
    def loaded_shards(self, table: str) -> dict[str, ShardLoad]:
        rows = self._conn.execute(
            "SELECT shard, sha256, rows FROM embedfresh.loaded_shards WHERE table_name = %s",
            (table,),
        ).fetchall()
        return {shard: ShardLoad(shard, sha, int(n)) for shard, sha, n in rows}

    @_translate
    def load_shard(
        self, table: str, shard: str, sha256: str, ids: np.ndarray, vectors: np.ndarray
    ) -> None:
        id_type, dim = self._catalogued(table)
        check_vectors(ids, vectors, dim)
        conn = self._conn
        statement = sql.SQL("COPY {} (id, embedding) FROM STDIN WITH (FORMAT BINARY)").format(
            _ident(table)
        )
        convert = int if id_type == "int64" else str
        with conn.transaction():
            with conn.cursor() as cur, cur.copy(statement) as copy:
                copy.set_types([_COPY_TYPES[id_type], "vector"])
                for i in range(len(ids)):
                    copy.write_row((convert(ids[i]), vectors[i]))
            conn.execute(
                "INSERT INTO embedfresh.loaded_shards (table_name, shard, sha256, rows) "
                "VALUES (%s, %s, %s, %s)",
                (table, shard, sha256, len(ids)),
            )
        faults.after_write("db", f"index/{table}/{shard}")

    @_translate
    def applied_changes(self, table: str) -> dict[str, AppliedChange]:
        rows = self._conn.execute(
            "SELECT change_set, sha256, upserts, deletes, etag FROM embedfresh.applied_changes "
            "WHERE table_name = %s ORDER BY change_set",
            (table,),
        ).fetchall()
        return {
            name: AppliedChange(name, sha, int(u), int(d), etag) for name, sha, u, d, etag in rows
        }

    @_translate
    def apply_changes(
        self,
        table: str,
        change: AppliedChange,
        upsert_ids: np.ndarray,
        vectors: np.ndarray,
        delete_ids: np.ndarray,
    ) -> bool:
        id_type, dim = self._catalogued(table)
        check_vectors(upsert_ids, vectors, dim)
        convert = int if id_type == "int64" else str
        conn = self._conn
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"table:{table}",))
            if conn.execute(
                "SELECT 1 FROM embedfresh.applied_changes WHERE table_name = %s "
                "AND change_set = %s",
                (table, change.name),
            ).fetchone():
                return False
            if len(delete_ids):
                conn.execute(
                    sql.SQL("DELETE FROM {} WHERE id = ANY(%s::{}[])").format(
                        _ident(table), sql.SQL(_SQL_TYPES[id_type])
                    ),
                    ([convert(i) for i in delete_ids],),
                )
            if len(upsert_ids):
                # COPY into a scratch table, then one INSERT ... ON CONFLICT: pgvector
                # keeps the HNSW graph as rows arrive (an updated row is a new tuple).
                conn.execute(
                    sql.SQL(
                        "CREATE TEMP TABLE changes_in (LIKE {} INCLUDING DEFAULTS) ON COMMIT DROP"
                    ).format(_ident(table))
                )
                with (
                    conn.cursor() as cur,
                    cur.copy(
                        "COPY changes_in (id, embedding) FROM STDIN WITH (FORMAT BINARY)"
                    ) as copy,
                ):
                    copy.set_types([_COPY_TYPES[id_type], "vector"])
                    for i in range(len(upsert_ids)):
                        copy.write_row((convert(upsert_ids[i]), vectors[i]))
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (id, embedding) SELECT id, embedding FROM changes_in "
                        "ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding"
                    ).format(_ident(table))
                )
            conn.execute(
                "INSERT INTO embedfresh.applied_changes (table_name, change_set, sha256, "
                "upserts, deletes, etag) VALUES (%s, %s, %s, %s, %s, %s)",
                (table, change.name, change.sha256, change.upserts, change.deletes, change.etag),
            )
        faults.after_write("db", f"index/{table}/changes/{change.name}")
        return True

    def _catalogued(self, table: str) -> tuple[str, int]:
        """The id type and dimension the catalogue records for ``table``."""
        row = self._conn.execute(
            "SELECT id_type, dim FROM embedfresh.tables WHERE name = %s", (table,)
        ).fetchone()
        if row is None:
            raise BadInputError(
                f"table {SCHEMA}.{table} is not in {SCHEMA}.tables of {self.location}"
            )
        return row[0], int(row[1])

    @_translate
    def build_ann(self, table: str, settings: AnnSettings) -> bool:
        conn = self._conn
        index = f"{table}_hnsw"
        if conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'{SCHEMA}."{index}"',)).fetchone()[
            0
        ]:
            return False

        # pgvector says, as a notice, when the graph outgrows maintenance_work_mem and the
        # build goes on on disk, several times slower: said in the log, with the setting.
        def said(notice: psycopg.errors.Diagnostic) -> None:
            if "maintenance_work_mem" not in (notice.message_primary or ""):
                log.info("building %s: %s", index, notice.message_primary)
                return
            log.warning("building %s: %s %s (maintenance_work_mem is %s: the index load's "
                        "setting)", index, notice.message_primary, notice.message_detail or "",
                        settings.maintenance_work_mem)  # fmt: skip

        conn.add_notice_handler(said)
        try:
            with conn.transaction():
                conn.execute(
                    sql.SQL("SET LOCAL maintenance_work_mem = {}").format(
                        sql.Literal(settings.maintenance_work_mem)
                    )
                )
                conn.execute(
                    sql.SQL(
                        "CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw "
                        "(embedding vector_cosine_ops) WITH (m = {}, ef_construction = {})"
                    ).format(
                        sql.Identifier(index),
                        _ident(table),
                        sql.Literal(settings.m),
                        sql.Literal(settings.ef_construction),
                    )
                )
                conn.execute(
                    "UPDATE embedfresh.tables SET indexed_at = now(), ann = %s WHERE name = %s",
                    (psycopg.types.json.Jsonb(settings.to_dict()), table),
                )
        finally:
            conn.remove_notice_handler(said)
        faults.after_write("db", f"index/{table}/hnsw")
        return True

    @_translate
    def count(self, table: str) -> int:
        return int(
            self._conn.execute(sql.SQL("SELECT count(*) FROM {}").format(_ident(table))).fetchone()[
                0
            ]
        )

    def scan(self, table: str, rows: int = 50_000) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        id_type, _ = self._catalogued(table)
        kind = np.int64 if id_type == "int64" else str
        statement = sql.SQL("SELECT id, embedding FROM {} ORDER BY id").format(_ident(table))
        with self._conn.transaction(), self._conn.cursor(name=f"scan_{table}") as cur:
            cur.itersize = rows
            cur.execute(statement)
            while batch := cur.fetchmany(rows):
                ids = np.asarray([r[0] for r in batch], dtype=kind)
                yield ids, np.stack([r[1].to_numpy() for r in batch]).astype(np.float32)

    @_translate
    def vectors(self, table: str, ids: np.ndarray) -> np.ndarray:
        id_type, dim = self._catalogued(table)
        convert = int if id_type == "int64" else str
        wanted = [convert(i) for i in ids]
        rows = self._conn.execute(
            sql.SQL("SELECT id, embedding FROM {} WHERE id = ANY(%s::{}[])").format(
                _ident(table), sql.SQL(_SQL_TYPES[id_type])
            ),
            (wanted,),
        ).fetchall()
        found = {r[0]: r[1].to_numpy() for r in rows}
        missing = [i for i in wanted if i not in found]
        if missing:
            raise BadInputError(f"table {SCHEMA}.{table} lacks ids {missing[:5]}")
        out = np.zeros((len(wanted), dim), dtype=np.float32)
        for n, i in enumerate(wanted):
            out[n] = found[i]
        return out

    @_translate
    def missing_ids(self, table: str, ids: np.ndarray) -> np.ndarray:
        id_type, _ = self._catalogued(table)
        values = [int(i) for i in ids] if id_type == "int64" else [str(i) for i in ids]
        missing: list[Any] = []
        statement = sql.SQL(
            "SELECT u.id FROM unnest(%s::{}[]) AS u(id) "
            "WHERE NOT EXISTS (SELECT 1 FROM {} t WHERE t.id = u.id)"
        ).format(sql.SQL(_SQL_TYPES[id_type]), _ident(table))
        for start in range(0, len(values), 100_000):
            rows = self._conn.execute(statement, (values[start : start + 100_000],)).fetchall()
            missing.extend(r[0] for r in rows)
        return np.sort(np.asarray(missing, dtype=np.int64 if id_type == "int64" else str))

    @_translate
    def search(
        self, table: str, queries: np.ndarray, k: int, ef_search: int | None = None
    ) -> SearchResult:
        conn = self._conn
        statement = sql.SQL(
            "SELECT id, embedding <=> %(q)s FROM {} ORDER BY embedding <=> %(q)s LIMIT %(k)s"
        ).format(_ident(table))
        ids: list[np.ndarray] = []
        distances: list[np.ndarray] = []
        seconds = np.zeros(len(queries))
        with conn.transaction():
            if ef_search is not None:
                conn.execute(
                    sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(ef_search))
                )
            with conn.cursor() as cur:
                for i, query in enumerate(np.asarray(queries, dtype=np.float32)):
                    t0 = time.perf_counter()
                    rows = cur.execute(statement, {"q": query, "k": k}, prepare=True).fetchall()
                    seconds[i] = time.perf_counter() - t0
                    ids.append(np.asarray([r[0] for r in rows]))
                    distances.append(np.asarray([r[1] for r in rows], dtype=np.float64))
        return SearchResult(ids=ids, distances=distances, seconds=seconds)

    # -- the live view ---------------------------------------------------------------

    @_translate
    def switch_live(
        self, model: str, corpus: str, table: str, only_from: LiveState | None = None
    ) -> bool:
        conn = self._conn
        view = live_view_name(model, corpus)
        with conn.transaction():
            state = self._locked_state(model, corpus)
            # Every call moves the generation, a no-op too: a repair that read the state
            # before this call never undoes it.
            conn.execute(
                "UPDATE embedfresh.live SET generation = nextval('embedfresh.live_generation') "
                "WHERE model = %s AND corpus = %s",
                (model, corpus),
            )
            if only_from is not None and state != only_from:
                return False
            if state[0] == table and self._versioned(view):
                return False
            found = conn.execute(
                "SELECT release, version FROM embedfresh.tables WHERE name = %s", (table,)
            ).fetchone()
            if found is None:
                raise BadInputError(f"table {SCHEMA}.{table} is not in {SCHEMA}.tables of "
                                    f"{self.location}: no live view of it")  # fmt: skip
            # Replaced in one transaction: a reader waits on the lock and then reads the
            # new view; it never finds none. (CREATE OR REPLACE cannot change the vector
            # dimension of a column.) Every row names its release and model version, so
            # a reader of the view alone knows which query encoder its vectors need.
            conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(_ident(view)))
            conn.execute(
                sql.SQL(
                    "CREATE VIEW {} AS SELECT id, embedding, {}::text AS release, "
                    "{}::text AS version FROM {}"
                ).format(_ident(view), sql.Literal(found[0]), sql.Literal(found[1]), _ident(table))
            )
            conn.execute(
                "INSERT INTO embedfresh.live (model, corpus, table_name, view_name, generation) "
                "VALUES (%s, %s, %s, %s, nextval('embedfresh.live_generation')) "
                "ON CONFLICT (model, corpus) DO UPDATE SET table_name = EXCLUDED.table_name, "
                "view_name = EXCLUDED.view_name, generation = EXCLUDED.generation, "
                "switched_at = now()",
                (model, corpus, table, view),
            )
        faults.after_write("db", f"index/live/{view}")
        return True

    @_translate
    def drop_live(self, model: str, corpus: str, only_from: LiveState | None = None) -> bool:
        conn = self._conn
        view = live_view_name(model, corpus)
        with conn.transaction():
            state = self._locked_state(model, corpus)
            if state[0] is None or (only_from is not None and state != only_from):
                return False
            conn.execute(
                "DELETE FROM embedfresh.live WHERE model = %s AND corpus = %s", (model, corpus)
            )
            conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(_ident(view)))
        faults.after_write("db", f"index/live/{view}/drop")
        return True

    @_translate
    def live_state(self, model: str, corpus: str) -> LiveState:
        row = self._conn.execute(
            "SELECT table_name, generation FROM embedfresh.live WHERE model = %s AND corpus = %s",
            (model, corpus),
        ).fetchone()
        return (None, 0) if row is None else (row[0], int(row[1]))

    def _locked_state(self, model: str, corpus: str) -> LiveState:
        """:meth:`live_state` under the view's lock (inside the caller's transaction)."""
        self._conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"live:{model}:{corpus}",)
        )
        return self.live_state(model, corpus)

    def _versioned(self, view: str) -> bool:
        """The view exists and names its rows' release and version (a view made before
        it did is made again)."""
        columns = self._conn.execute(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND attname IN ('release', 'version') AND NOT attisdropped",
            (f'{SCHEMA}."{view}"',),
        ).fetchone()[0]
        return columns == 2

    @_translate
    def live_table(self, model: str, corpus: str) -> str | None:
        row = self._conn.execute(
            "SELECT table_name FROM embedfresh.live WHERE model = %s AND corpus = %s",
            (model, corpus),
        ).fetchone()
        return None if row is None else row[0]

    @_translate
    def tables(self, model: str) -> list[TableInfo]:
        rows = self._conn.execute(
            "SELECT t.name, t.model, t.release, t.corpus, t.version, t.dim, "
            "coalesce(sum(s.rows), 0), t.created_at, t.indexed_at IS NOT NULL "
            "FROM embedfresh.tables t LEFT JOIN embedfresh.loaded_shards s "
            "ON s.table_name = t.name WHERE t.model = %s GROUP BY t.name ORDER BY t.created_at",
            (model,),
        ).fetchall()
        return [
            TableInfo(name, m, release, corpus, version, dim, int(rows), created, indexed)
            for name, m, release, corpus, version, dim, rows, created, indexed in rows
        ]

    @_translate
    def drop_table(self, table: str) -> bool:
        conn = self._conn
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"table:{table}",))
            live = conn.execute(
                "SELECT model, corpus FROM embedfresh.live WHERE table_name = %s", (table,)
            ).fetchone()
            if live is not None:
                raise BadInputError(
                    f"table {SCHEMA}.{table} is the live table of {live[0]} {live[1]}: not dropped"
                )
            known = conn.execute(
                "DELETE FROM embedfresh.tables WHERE name = %s RETURNING name", (table,)
            ).fetchone()
            if known is None:
                return False
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_ident(table)))
        faults.after_write("db", f"index/{table}/drop")
        return True
