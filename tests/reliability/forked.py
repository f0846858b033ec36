"""Job processes without the interpreter start: ``python -m embedfresh.jobs.<name>``
run as a child forked from a server that has imported torch and the jobs once.

The fault-point matrix starts two job processes per point (the killed one and the plain
re-run), a few hundred in all; a fresh interpreter pays ~2-4 s of imports each time on
this box, a forked child ~20 ms. The child is still a real process of its own: it has
its own pid, the SIGKILL of a fault point ends it alone, its exit code is the job's
(``sys.exit`` from :func:`embedfresh.core.cli.main_for`, -9 when killed), and it runs
the module as ``__main__`` exactly as ``python -m`` does. Its environment is the
server's (set from :func:`tests.conftest.job_env` when the server starts) plus what the
caller adds; stdout and stderr go to files.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT, job_env

#: Imported once by the server, before any child is forked.
PRELOAD = [
    "torch",
    "embedfresh.core.cli",
    "embedfresh.ml.training",
    "embedfresh.ml.evaluation",
    "embedfresh.jobs.train",
    "embedfresh.jobs.evaluate",
    "embedfresh.jobs.gate",
    "embedfresh.jobs.embed",
    "embedfresh.jobs.embed_verify",
    "embedfresh.jobs.index_load",
    "embedfresh.jobs.search_check",
    "embedfresh.jobs.release",
    "embedfresh.jobs.export_st",
    "embedfresh.jobs.compile",
    "embedfresh.jobs.rollback",
    "embedfresh.jobs.garbage_collect",
]


@dataclass(frozen=True)
class Finished:
    exitcode: int
    stdout: str
    stderr: str


def _child(module: str, argv: list[str], env: dict[str, str], out: str, err: str) -> None:
    os.environ.update(env)
    for stream, path in ((1, out), (2, err)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, stream)
        os.close(fd)
    sys.argv = [module, *argv]
    os.chdir(ROOT)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class ForkServer:
    """Starts job processes forked from one preloaded server (see the module's doc)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._n = 0
        saved = dict(os.environ)
        os.environ.update(job_env())  # the server's environment: set before torch loads
        try:
            self.ctx = multiprocessing.get_context("forkserver")
            self.ctx.set_forkserver_preload(PRELOAD)
            warm = self.ctx.Process(target=len, args=((),))
            warm.start()
            warm.join()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def run(
        self, name: str, *sets: str, env: dict[str, str] | None = None, timeout: float = 600
    ) -> Finished:
        """Run ``python -m embedfresh.jobs.<name> --set ...`` in a forked child."""
        self._n += 1
        out, err = self.workdir / f"{self._n}.out", self.workdir / f"{self._n}.err"
        argv = [a for s in sets for a in ("--set", s)]
        child = self.ctx.Process(
            target=_child,
            args=(f"embedfresh.jobs.{name}", argv, dict(env or {}), str(out), str(err)),
        )
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise TimeoutError(f"{name} ran past {timeout} s")
        return Finished(child.exitcode, out.read_text(), err.read_text())

    def run_ranks(
        self,
        name: str,
        *sets: str,
        world_size: int,
        port: int,
        env: dict[str, str] | None = None,
        timeout: float = 600,
    ) -> list[Finished]:
        """The job as ``world_size`` ranks on this host, each a forked child with the
        environment torchrun gives its workers (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
        ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``: the job's process group
        meets at ``port``). When one rank dies by a signal the others are killed, as a
        launcher tears down a job whose host was lost. Each rank's outcome, rank order."""
        argv = [a for s in sets for a in ("--set", s)]
        children, files = [], []
        for rank in range(world_size):
            self._n += 1
            out, err = self.workdir / f"{self._n}.out", self.workdir / f"{self._n}.err"
            ranked = {
                **(env or {}),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            child = self.ctx.Process(
                target=_child, args=(f"embedfresh.jobs.{name}", argv, ranked, str(out), str(err))
            )
            child.start()
            children.append(child)
            files.append((out, err))
        deadline = time.monotonic() + timeout
        while any(c.exitcode is None for c in children):
            if any((c.exitcode or 0) < 0 for c in children) or time.monotonic() > deadline:
                for c in children:
                    if c.exitcode is None:
                        c.kill()
            time.sleep(0.02)
        for c in children:
            c.join()
        return [
            Finished(c.exitcode, o.read_text(), e.read_text())
            for c, (o, e) in zip(children, files, strict=True)
        ]
