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
