"""The compile cache the compile tests share: one store (``compile_cache_root``) holding
the cpu ``torch.compile`` entry of a one-process compile job, built once per session
(per pytest-xdist worker: fixture ``cpu_compile_cache`` of ``tests/conftest.py``).

``tests/test_compile_job.py`` checks that compile (a cold one: the job always compiles
in a fresh inductor directory), restores its entry into a train run and hits it again;
``tests/test_compile_ddp.py`` compiles its 2-process entry into a store holding a copy
of the cache (:meth:`CompileCache.copy_into`) and shows that a one-process train's lookup finds the
one-process entry, not its own. Nothing writes into the shared cache.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from embedfresh.core import layout
from embedfresh.core.storage import ArtifactStore
from tests.conftest import files_sha256, run_job

RUN_ID = "c1"


@dataclass(frozen=True)
class CompileCache:
    """``root``: the store the compile job ran in (its report, its data); ``cache``: the
    ``compile_cache_root`` it wrote its entry into; ``compiled``: the job's process."""

    root: str
    cache: str
    compiled: subprocess.CompletedProcess

    @property
    def cache_path(self) -> Path:
        return Path(self.cache.removeprefix("file://"))

    def report(self) -> dict:
        return ArtifactStore(self.root).read_json(layout.report("tiny", RUN_ID, "compile"))

    def copy_into(self, store: Path) -> None:
        """The cache's entries copied into the store at ``store`` (its ``compile-cache/``,
        where a job finds them without ``compile_cache_root``), for a test that writes
        entries."""
        shutil.copytree(self.cache_path / "compile-cache", store / "compile-cache")

    def snapshot(self) -> dict[str, str]:
        """Every file of the cache with its sha256."""
        return files_sha256(self.cache_path)


def cpu_compile_cache(data_template: Path, where: Path) -> CompileCache:
    """``python -m embedfresh.jobs.compile`` with ``compile=on``, one process, in a copy
    of the generated data at ``where``, its entry in a cache store of its own."""
    store, cache = where / "artifacts", where / "compile-cache-root"
    shutil.copytree(data_template, store)
    cache.mkdir()
    root, cache_root = f"file://{store}", f"file://{cache}"
    compiled = run_job(
        "compile",
        f"artifact_root={root}",
        f"compile_cache_root={cache_root}",
        f"run_id={RUN_ID}",
        "compile=on",
        # Not the directory the job compiles in: it makes a fresh one (restores need
        # every file of it, and nothing else).
        env={"TORCHINDUCTOR_CACHE_DIR": str(where / "unused")},
    )
    return CompileCache(root, cache_root, compiled)
