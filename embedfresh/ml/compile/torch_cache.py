"""What makes a fresh process start torch.compile warm: the mega-cache
(``torch.compiler.save_cache_artifacts()``) and an archive of the inductor cache
directory (``TORCHINDUCTOR_CACHE_DIR``), stored together as one compile-cache entry.

Both are needed on CPU (FACTS.md): a first step took 27-33 s cold, 21.6 s with the
mega-cache alone and 6.9 s with the inductor directory kept, because the mega-cache does
not carry the compiled C++.
"""

from __future__ import annotations

import io
import logging
import os
import tarfile
import tempfile
import time
from typing import Any

from embedfresh.core import layout, markers
from embedfresh.core.storage import ArtifactStore

log = logging.getLogger("embedfresh.jobs.compile")

MEGA_CACHE = "mega-cache.bin"
INDUCTOR_ARCHIVE = "inductor-cache.tar.gz"
INDUCTOR_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"


def fresh_inductor_dir() -> str:
    """Point ``TORCHINDUCTOR_CACHE_DIR`` at a new empty directory (before compiling)."""
    path = tempfile.mkdtemp(prefix="inductor-cache-")
    os.environ[INDUCTOR_DIR_ENV] = path
    return path


def collect(inductor_dir: str) -> dict[str, bytes]:
    """The entry's files after a compiled trial run in this process."""
    import torch  # noqa: PLC0415

    saved = torch.compiler.save_cache_artifacts()
    mega = b"" if saved is None else saved[0]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(inductor_dir, arcname=".")
    return {MEGA_CACHE: mega, INDUCTOR_ARCHIVE: buffer.getvalue()}


def restore(store: ArtifactStore, backend: str, key: str) -> dict[str, Any]:
    """Load the committed entry ``backend/key``, if any, before compiling: extract the
    inductor archive into ``TORCHINDUCTOR_CACHE_DIR`` (a fresh directory unless one is
    set) and load the mega-cache. Returns what happened, for the train report."""
    import torch  # noqa: PLC0415

    rel = layout.compile_cache(backend, key)
    result: dict[str, Any] = {"key": key, "url": store.url(rel), "hit": False}
    check = markers.verify(store, rel)
    if not check.ok:
        log.info("no usable compile-cache entry at %s (%s): compiling cold", rel, check.reason)
        result["reason"] = check.reason
        return result
    started = time.perf_counter()
    target = os.environ.get(INDUCTOR_DIR_ENV) or fresh_inductor_dir()
    os.makedirs(target, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(store.read_bytes(f"{rel}/{INDUCTOR_ARCHIVE}"))) as tar:
        tar.extractall(target, filter="data")  # no absolute paths, links out, devices
    mega = store.read_bytes(f"{rel}/{MEGA_CACHE}")
    if mega:
        torch.compiler.load_cache_artifacts(mega)
    result.update(hit=True, inductor_dir=target, restore_seconds=time.perf_counter() - started)
    log.info("restored compile-cache entry %s into %s", store.url(rel), target)
    return result
