"""What makes a fresh process start torch.compile warm: the mega-cache
(``torch.compiler.save_cache_artifacts()``) and an archive of the inductor cache
directory (``TORCHINDUCTOR_CACHE_DIR``), stored together as one compile-cache entry.

Both are needed on CPU (FACTS.md): a first step took 27-33 s cold, 21.6 s with the
mega-cache alone and 6.9 s with the inductor directory kept, because the mega-cache does
not carry the compiled C++.

A third file, ``vec-isa.json`` (cpu backend, x86), records inductor's check of the
CPU's vector ISAs in the compile job: before it uses AVX-512 or AVX2, inductor builds a
test kernel for each and loads it in a fresh ``python -c "import torch; ..."``, ~1.3 s
each. The compile job runs that check before its trial; when every ISA the CPU offers
passed, the trial compiles with ``torch._inductor.config.cpp.vec_isa_ok`` set, and a
restore on a CPU that offers the same ISAs (the key holds its ISA flags) sets it too,
skipping those checks. Both sides must set it: inductor's config is part of its cache
keys, so a restore that set it alone would miss every graph (measured: 13.7 s to the
first step instead of 5.5).

``vec_isa_ok`` does not cover the extension checks inductor runs after it (AVX512-BF16
on AVX-512 CPUs; AMX and AMX-FP16 too on AMX ones), each another test build and
``python -c``. The compile job records each test build's outcome (``builds``: by ISA and
a digest of inductor's own fingerprint of the build, i.e. compiler version, flags and
torch version, and of the test code) and the same restore answers those builds from
the record instead of running them; a build it has no record of runs as before.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import logging
import os
import platform
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable
from typing import Any

from embedfresh.core import layout, markers
from embedfresh.core.storage import ArtifactStore

log = logging.getLogger("embedfresh.jobs.compile")

MEGA_CACHE = "mega-cache.bin"
INDUCTOR_ARCHIVE = "inductor-cache.tar.gz"
VEC_ISA = "vec-isa.json"
INDUCTOR_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"


def fresh_inductor_dir() -> str:
    """Point ``TORCHINDUCTOR_CACHE_DIR`` at a new empty directory (before compiling)."""
    path = tempfile.mkdtemp(prefix="inductor-cache-")
    os.environ[INDUCTOR_DIR_ENV] = path
    return path


def collect(inductor_dir: str, vec_isa: dict[str, Any] | None = None) -> dict[str, bytes]:
    """The entry's files after a compiled trial run in this process; ``vec_isa``: what
    :func:`check_vec_isa` returned before the trial."""
    import torch  # noqa: PLC0415

    saved = torch.compiler.save_cache_artifacts()
    mega = b"" if saved is None else saved[0]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(inductor_dir, arcname=".")
    files = {MEGA_CACHE: mega, INDUCTOR_ARCHIVE: buffer.getvalue()}
    if vec_isa:
        files[VEC_ISA] = json.dumps(vec_isa, sort_keys=True).encode()
    return files


def vec_isa_checks(run: bool) -> dict[str, Any]:
    """Inductor's vector ISAs on this x86 CPU: ``offered`` (its flags have them) and, with
    ``run``, ``valid`` (their test kernels built and loaded). {} off x86, or where torch's
    internals differ from what this expects."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return {}
    try:
        from torch._inductor import cpu_vec_isa  # noqa: PLC0415

        flags = cpu_vec_isa.x86_isa_checker()
        offered = [
            str(isa)
            for isa in cpu_vec_isa.supported_vec_isa_list
            if all(flag in flags for flag in str(isa).split())
        ]
        checks: dict[str, Any] = {"offered": offered}
        if run:
            builds: dict[str, bool] = {}
            with _recording_builds(cpu_vec_isa.supported_vec_isa_list, builds):
                checks["valid"] = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
            checks["builds"] = builds
        return checks
    except (ImportError, AttributeError, TypeError):
        return {}


def _build_key(isa: Any, code: str) -> str | None:
    """One ISA test build: the ISA, then a digest of what inductor keys the build by (the
    compiler's version, the ISA's flags at the time, as an extension check adds its own,
    and torch's version) and of the test code. None where torch has no such fingerprint:
    nothing is recorded or answered then."""
    try:
        from torch._inductor import cpu_vec_isa  # noqa: PLC0415

        fingerprint = cpu_vec_isa._get_isa_dry_compile_fingerprint(isa._arch_flags)
    except (ImportError, AttributeError):
        return None
    digest = hashlib.sha256(f"{fingerprint}\0{code}".encode()).hexdigest()[:16]
    return f"{isa}|{digest}"


def _answer_builds(isas: list[Any], answer: Callable[[Any, Any, str], bool]) -> None:
    """Route each ISA's test builds through ``answer(isa, its real check_build, code)``
    (an instance attribute shadowing the method, in this process only)."""
    for isa in isas:
        isa.check_build = functools.partial(answer, isa, isa.check_build)


@contextlib.contextmanager
def _recording_builds(isas: list[Any], builds: dict[str, bool]):
    """Record into ``builds`` the outcome of every test build ``isas`` run inside."""

    def record(isa: Any, real: Any, code: str) -> bool:
        ok = bool(real(code))
        key = _build_key(isa, code)
        if key is not None:
            builds[key] = ok
        return ok

    _answer_builds(isas, record)
    try:
        yield
    finally:
        for isa in isas:
            vars(isa).pop("check_build", None)


def _replay_builds(builds: dict[str, bool], answered: dict[str, int]) -> None:
    """Answer inductor's ISA test builds from ``builds`` (recorded by the compile job on a
    CPU with the same flags) for the rest of this process, counting each answer in
    ``answered["vec_isa_builds_answered"]``; a build not recorded (another compiler, other
    flags) runs as before."""
    answered["vec_isa_builds_answered"] = 0
    if not builds:
        return
    try:
        from torch._inductor import cpu_vec_isa  # noqa: PLC0415

        isas = list(cpu_vec_isa.supported_vec_isa_list)
    except (ImportError, AttributeError):
        return

    def replay(isa: Any, real: Any, code: str) -> bool:
        recorded = builds.get(_build_key(isa, code) or "")
        if recorded is None:
            return real(code)
        answered["vec_isa_builds_answered"] += 1
        return recorded

    _answer_builds(isas, replay)


def check_vec_isa() -> dict[str, Any]:
    """In the compile job on cpu, before its trial compiles: run inductor's ISA check
    now. ``vec_isa_ok`` in the result when every ISA this CPU offers passed: the trial
    then compiles under :func:`vec_isa_setting`, as a restore will. {} when
    ``TORCHINDUCTOR_VEC_ISA_OK`` is set: the operator's choice, the same on both sides."""
    if os.environ.get("TORCHINDUCTOR_VEC_ISA_OK") is not None:
        return {}
    checks = vec_isa_checks(run=True)
    if checks.get("offered") and checks.get("valid") == checks["offered"]:
        checks["vec_isa_ok"] = True
    return checks


def same_cpu_vec_isa(checks: dict[str, Any]) -> dict[str, Any]:
    """On another rank of a data-parallel trial: ``checks`` (rank 0's
    :func:`check_vec_isa`) when they allow ``vec_isa_ok`` and this CPU offers the same
    ISAs, as a restore takes them; else this rank's own check."""
    if checks.get("vec_isa_ok") and vec_isa_checks(run=False).get("offered") == checks["offered"]:
        return checks
    return check_vec_isa()


def vec_isa_setting(checks: dict[str, Any]) -> contextlib.AbstractContextManager[Any]:
    """``vec_isa_ok`` set while inside (the trial only, not the rest of the process) when
    ``checks`` allow it."""
    if not checks.get("vec_isa_ok"):
        return contextlib.nullcontext()
    from torch._inductor import config  # noqa: PLC0415

    return config.patch({"cpp.vec_isa_ok": True})


def _skip_vec_isa_check(recorded: dict[str, Any]) -> bool:
    """On a restore (the train job's own process): set ``vec_isa_ok`` as the compile
    job's trial had it, when it did and this CPU offers the same ISAs."""
    if os.environ.get("TORCHINDUCTOR_VEC_ISA_OK") is not None or not recorded.get("vec_isa_ok"):
        return False
    if vec_isa_checks(run=False).get("offered") != recorded.get("offered"):
        return False
    from torch._inductor import config  # noqa: PLC0415

    config.cpp.vec_isa_ok = True
    return True


def _extract(tar: tarfile.TarFile, target: str) -> None:
    """Extract ``tar`` into ``target``, each file moved in whole (``os.replace``): the
    ranks of a data-parallel train restore into one ``TORCHINDUCTOR_CACHE_DIR`` at once,
    and none may load a file another is still writing."""
    staging = tempfile.mkdtemp(prefix=".restore-", dir=target)
    try:
        tar.extractall(staging, filter="data")  # no absolute paths, links out, devices
        for folder, dirs, files in os.walk(staging):
            dest = os.path.normpath(os.path.join(target, os.path.relpath(folder, staging)))
            os.makedirs(dest, exist_ok=True)
            links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
            for name in [*files, *links]:
                os.replace(os.path.join(folder, name), os.path.join(dest, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
        _extract(tar, target)
    mega = store.read_bytes(f"{rel}/{MEGA_CACHE}")
    if mega:
        torch.compiler.load_cache_artifacts(mega)
    recorded = {}
    if backend == "cpu" and VEC_ISA in (check.marker or {}).get("files", {}):
        recorded = json.loads(store.read_bytes(f"{rel}/{VEC_ISA}"))
    result["vec_isa_check_skipped"] = _skip_vec_isa_check(recorded)
    if result["vec_isa_check_skipped"]:  # the same CPU flags: its test builds' outcomes too
        _replay_builds(recorded.get("builds") or {}, result)  # counted as inductor asks
    result.update(hit=True, inductor_dir=target, restore_seconds=time.perf_counter() - started)
    log.info(
        "restored compile-cache entry %s into %s%s",
        store.url(rel),
        target,
        (
            f"; vector ISAs {recorded['valid']} passed inductor's check when the entry was "
            "built on a CPU with these flags: not checked again"
            if result["vec_isa_check_skipped"]
            else ""
        ),
    )
    return result
