"""The two registries, by worked example: a new accelerator backend and a new storage
scheme, each one class plus one registration line, carrying real work.

- A toy backend (eager CPU that counts the batches it moves and the steps it marks),
  registered with :func:`embedfresh.ml.backends.register_backend`, runs the evaluation
  of a model version by name, as a job would pick it.
- A toy scheme (``memory://`` on fsspec's in-process memory filesystem), registered
  with :func:`embedfresh.core.storage.register_scheme`, carries a generated data set,
  commit markers and the model registry's compare-and-swap.
- The names the control plane offers are exactly the registered backends plus
  ``auto``, and unknown names are refused with the known ones listed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import ClassVar

import fsspec
import pytest
import torch

from embedfresh.core import layout, markers
from embedfresh.core.exit_codes import BadInputError, ConflictError
from embedfresh.core.parquet import read_parquet
from embedfresh.core.registry import Registry
from embedfresh.core.settings import (
    AUTO_BACKEND,
    BACKEND_IMPLEMENTATIONS,
    BACKENDS,
    load_implementation,
)
from embedfresh.core.storage import (
    ArtifactStore,
    Scheme,
    register_scheme,
    scheme_names,
    unregister_scheme,
)
from embedfresh.ml.backends import (
    Backend,
    backend_names,
    get_backend,
    register_backend,
    unregister_backend,
)
from tests.conftest import DAY1, ROOT, job_env
from tests.releasing import bare_release

# -- a toy backend -------------------------------------------------------------------------


class CountingBackend(Backend):
    """Eager PyTorch on the CPU that counts what the loops ask of it."""

    built: ClassVar[list[CountingBackend]] = []

    @classmethod
    def create(cls, name: str) -> Backend:
        backend = cls(name, torch.device("cpu"))
        cls.built.append(backend)
        return backend

    def __init__(self, name: str, device: torch.device) -> None:
        super().__init__(name, device)
        self.batches = 0
        self.steps = 0

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.batches += 1
        return super().to_device(batch)

    def mark_step(self) -> None:
        self.steps += 1


@pytest.fixture
def counting_backend() -> Iterator[type[CountingBackend]]:
    CountingBackend.built.clear()
    register_backend("counting-cpu", CountingBackend)  # the one registration line
    try:
        yield CountingBackend
    finally:
        unregister_backend("counting-cpu")
        CountingBackend.built.clear()


def test_a_registered_backend_runs_an_evaluation_by_name(counting_backend, root):
    from embedfresh.core.config import EvaluateConfig
    from embedfresh.ml.evaluation import evaluate_version
    from embedfresh.ml.model import versions

    versions.ensure_baseline(ArtifactStore(root), "tiny", "baseline", 0)
    batch_size = 64
    cfg = EvaluateConfig(
        artifact_root=root,
        run_id="counted",
        version="baseline",
        backend="counting-cpu",
        batch_size=batch_size,
    )
    report, _, _ = evaluate_version(cfg)

    assert report["backend"] == "counting-cpu"  # the backend's own metadata
    [backend] = counting_backend.built
    # One batch at a time, each marked: the scored pairs in fixed-shape batches, then the
    # corpus and the judged queries in the embed route's length buckets.
    head = math.ceil(report["n_examples"] / batch_size)
    assert backend.batches == backend.steps > head + 1
    assert report["search"]["vectors"]["backend"] == "counting-cpu"
    assert 0.0 <= report["metrics"]["accuracy"] <= 1.0


def test_a_backend_registered_by_module_string_is_imported_when_built():
    # The module as pytest imported it (its name depends on pytest's import mode).
    register_backend("counting-by-path", f"{CountingBackend.__module__}:CountingBackend")
    try:
        assert "counting-by-path" in backend_names()
        backend = get_backend("counting-by-path")
        assert type(backend) is CountingBackend and backend.name == "counting-by-path"
    finally:
        unregister_backend("counting-by-path")
        CountingBackend.built.clear()
    assert "counting-by-path" not in backend_names()


def test_register_backend_refuses_reserved_taken_and_wrong_implementations(counting_backend):
    with pytest.raises(ValueError, match="reserved"):
        register_backend(AUTO_BACKEND, CountingBackend)
    with pytest.raises(ValueError, match="already registered"):
        register_backend("counting-cpu", CountingBackend)
    with pytest.raises(ValueError, match="already registered"):
        register_backend("cpu", CountingBackend)
    with pytest.raises(TypeError, match="neither a Backend subclass"):
        register_backend("not-a-backend", object)  # type: ignore[arg-type]
    register_backend("counting-cpu", CountingBackend, replace=True)
    with pytest.raises(ValueError, match="unknown backend 'never-registered'"):
        unregister_backend("never-registered")
    register_backend("bad-path", "embedfresh.core.settings:BACKENDS")
    try:
        with pytest.raises(TypeError, match="not a Backend subclass"):
            get_backend("bad-path")
    finally:
        unregister_backend("bad-path")


# -- a toy storage scheme ------------------------------------------------------------------

# The memory filesystem lives in this process only, so one process-wide lock makes its
# check-then-write atomic against every other writer.
_MEMORY_CAS = threading.Lock()


class MemoryScheme(Scheme):
    """``memory://name/prefix``: fsspec's in-process memory filesystem."""

    def filesystem(self) -> fsspec.AbstractFileSystem:
        return fsspec.filesystem("memory")

    def write_if_match(self, fs, path, data, expected_etag, url) -> None:
        with _MEMORY_CAS:
            current = self.etag(fs, path)
            if current != expected_etag:
                raise ConflictError(
                    f"{url} changed under us (expected version {expected_etag}, "
                    f"found {current}): a concurrent run won"
                )
            self.write(fs, path, data)


@pytest.fixture
def memory_root() -> Iterator[str]:
    register_scheme("memory", MemoryScheme)  # the one registration line
    name = f"t-{uuid.uuid4().hex[:12]}"
    try:
        yield f"memory://{name}/store"
    finally:
        unregister_scheme("memory")
        fs = fsspec.filesystem("memory")
        if fs.exists(name):
            fs.rm(name, recursive=True)


def test_a_registered_scheme_carries_data_markers_and_the_registry(memory_root):
    from embedfresh.ml.data.generate import write_dataset
    from embedfresh.ml.data.reader import read_eval

    store = ArtifactStore(memory_root)
    assert store.protocol == "memory" and store.root == memory_root
    memory = fsspec.filesystem("memory")

    # A generated data set: Parquet written through the scheme, read back by the reader.
    write_dataset(store, "products", 0, DAY1, 1, 64, 48, "products", 30, 30)
    assert len(read_eval(store, "products", {})) == 48
    part = f"{layout.eval_split('products')}/part-00000.parquet"
    assert read_parquet(store, part).num_rows == 48
    assert memory.cat_file(store.path(part)) == store.read_bytes(part)

    # Committed directories: written, then the marker; verified by size and checksum.
    for version in ("v1", "v2"):
        directory = layout.model_version("tiny", version)
        files = {"weights.bin": version.encode() * 100, "model.json": b"{}"}
        markers.publish(store, directory, files, meta={"model": "tiny", "version": version})
        assert markers.verify(store, directory).ok
    memory.pipe_file(store.path(f"{layout.model_version('tiny', 'v2')}/weights.bin"), b"bad")
    assert "weights.bin" in markers.verify(store, layout.model_version("tiny", "v2")).reason
    memory.pipe_file(store.path(f"{layout.model_version('tiny', 'v2')}/weights.bin"), b"v2" * 100)

    # The releases, written once (create-only), and the registry: create-if-absent, then
    # a swap on the version tag just read.
    bare_release(store, "tiny", "v1", expected_version=None)
    bare_release(store, "tiny", "v2", expected_version="v1")
    doc = json.loads(memory.cat_file(store.path(layout.registry("tiny"))))
    assert doc["production"]["version"] == "v2" and doc["production"]["release"] == "v2"
    assert [h["version"] for h in doc["history"]] == ["v1", "v2"]
    for version in ("v1", "v2"):
        stored = json.loads(memory.cat_file(store.path(layout.release("tiny", version))))
        assert stored["kind"] == "release" and stored["version"] == version
    # A release decided against a production that has moved on since: nothing written.
    before = memory.cat_file(store.path(layout.registry("tiny")))
    with pytest.raises(ConflictError, match=r"production version is 'v2', expected 'v1'"):
        bare_release(store, "tiny", "v1", "v1-again", expected_version="v1")
    assert memory.cat_file(store.path(layout.registry("tiny"))) == before
    assert Registry(store, "tiny").production_version() == "v2"

    # A writer holding a stale tag loses, and nothing it wrote lands.
    stale = store.etag(layout.registry("tiny"))
    store.write_if_match(layout.registry("tiny"), b'{"moved": 1}', stale)
    with pytest.raises(ConflictError, match="changed under us"):
        store.write_if_match(layout.registry("tiny"), b'{"moved": 2}', stale)
    with pytest.raises(ConflictError):
        store.write_if_match(layout.registry("tiny"), b"{}", None)  # must not exist
    assert memory.cat_file(store.path(layout.registry("tiny"))) == b'{"moved": 1}'


def test_a_scheme_is_served_only_while_registered(memory_root):
    assert "memory" in scheme_names()
    with pytest.raises(
        BadInputError, match=r"unsupported scheme 'gs' \(use file://, s3:// or memory://\)"
    ):
        ArtifactStore("gs://bucket/prefix")
    unregister_scheme("memory")
    try:
        with pytest.raises(
            BadInputError, match=r"unsupported scheme 'memory' \(use file:// or s3://\)"
        ):
            ArtifactStore(memory_root)
    finally:
        register_scheme("memory", MemoryScheme)  # the fixture unregisters it
    with pytest.raises(ValueError, match="already registered"):
        register_scheme("memory", MemoryScheme)
    with pytest.raises(ValueError, match="not a lower-case URL scheme"):
        register_scheme("Mem", MemoryScheme)
    with pytest.raises(TypeError, match="neither a Scheme subclass"):
        register_scheme("mem2", CountingBackend)  # type: ignore[arg-type]


# -- what the control plane sees -----------------------------------------------------------


def test_the_control_plane_offers_exactly_the_registered_backends():
    assert BACKENDS == (AUTO_BACKEND, *backend_names())
    assert BACKENDS[0] == "auto" and len(set(BACKENDS)) == len(BACKENDS)
    assert set(backend_names()) == set(BACKEND_IMPLEMENTATIONS) == {"cpu", "cuda", "xla", "neuron"}
    for name, spec in BACKEND_IMPLEMENTATIONS.items():
        cls = load_implementation(spec)  # the module imports; nothing is built
        assert issubclass(cls, Backend), name
        assert cls.create.__func__ is not Backend.create.__func__, f"{name}: {spec} has no create"


def test_a_runtime_registration_is_a_jobs_name_not_a_dag_choice(counting_backend):
    assert "counting-cpu" in backend_names()
    assert "counting-cpu" not in BACKENDS  # the DAGs offer the built-in registry only


def test_backend_names_are_read_without_torch_and_built_lazily():
    code = (
        "import sys\n"
        "from embedfresh.core.settings import BACKENDS\n"
        "assert 'torch' not in sys.modules, 'the control plane imported torch'\n"
        "from embedfresh.ml.backends import get_backend\n"
        "get_backend('cpu')\n"
        "print(sorted(m for m in sys.modules\n"
        "             if m.startswith(('torch_xla', 'embedfresh.ml.backends.'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1].replace("'", '"'))
    assert loaded == ["embedfresh.ml.backends.base", "embedfresh.ml.backends.eager"]


def test_unknown_names_are_refused_with_the_known_ones(counting_backend):
    with pytest.raises(
        BadInputError,
        match=r"unknown backend 'tpu': choose one of auto, cpu, cuda, xla, neuron, counting-cpu$",
    ):
        get_backend("tpu")
    with pytest.raises(BadInputError, match=r"unsupported scheme 'gs' \(use file:// or s3://\)"):
        ArtifactStore("gs://bucket/prefix")
