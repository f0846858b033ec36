"""The compiled embed forward (``compile=true``): the same vectors as the eager forward,
its graphs stored in the compile cache by the first run and loaded, not compiled, by the
next process; and the settings it cannot run refused before anything is written."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedfresh.core import layout
from embedfresh.core.parquet import read_parquet
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec
from tests.conftest import run_job

SCRIPTS = [
    "Größe 44, wasserdichte Wanderschuhe aus Leder",
    "سماعات لاسلكية مع خاصية إلغاء الضوضاء",
    "无线蓝牙耳机，主动降噪，长续航",
    "Ασύρματα ακουστικά με ακύρωση θορύβου",
    "हेडफ़ोन, शोर रद्द करने वाला, लंबी बैटरी",
]


def _root(tmp_path, name: str) -> tuple[str, ArtifactStore]:
    root = f"file://{tmp_path / name}"
    store = ArtifactStore(root)
    spec = get_spec("tiny")
    # The same weights in every root: the vectors of two roots are comparable.
    versions.publish(store, spec, "v1", cpu_state_dict(versions.build_model(spec, 7)), {})
    rng = np.random.default_rng(3)
    for shard in range(2):
        # 2-60 characters of one script or two: both buckets (16 and 32 tokens) get texts.
        texts = [
            " ".join(rng.choice(SCRIPTS, size=2))[: int(rng.integers(2, 60))] for _ in range(40)
        ]
        ids = [f"sku-{shard}-{i:04d}-ß" for i in range(40)]
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({"id": ids, "text": texts}), sink)
        store.write_bytes(
            f"{layout.corpus('products')}/{layout.part_name(shard)}", sink.getvalue().to_pybytes()
        )
    return root, store


def _vectors(store: ArtifactStore) -> np.ndarray:
    out = layout.embeddings("tiny", "v1", "products")
    parts = [read_parquet(store, f"{out}/{layout.part_name(i)}") for i in range(2)]
    table = pa.concat_tables(parts)
    return np.stack(table.column("embedding").to_numpy(zero_copy_only=False))


def _report(store: ArtifactStore, run_id: str) -> dict:
    return json.loads(store.read_bytes(layout.report("tiny", run_id, "embed-products")))


# The tiny model truncates at 32 tokens; two buckets (16, 32): two graphs.
SETS = ("model=tiny", "version=v1", "lengths=[16]", "token_budget=256")


def test_compiled_forward_equals_eager_and_a_warm_process_compiles_nothing(tmp_path) -> None:
    cold_root, cold = _root(tmp_path, "cold")
    done = run_job("embed", f"artifact_root={cold_root}", "run_id=cold", "compile=true", *SETS)
    assert done.returncode == 0, done.stderr[-3000:]
    report = _report(cold, "cold")
    assert report["forward"] == "compiled"
    assert report["compile"]["hit"] is False
    shapes = len(report["shapes"])  # one graph per bucket the texts fell in
    assert shapes >= 1
    assert report["compile"]["graph_cache"]["fx_graph_cache_misses"] == shapes  # compiled here
    assert cold.exists(f"{layout.compile_cache('cpu', report['compile']['key'])}/COMMIT")

    eager_root, eager = _root(tmp_path, "eager")
    done = run_job("embed", f"artifact_root={eager_root}", "run_id=eager", *SETS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _report(eager, "eager")["forward"] == "packed"
    a, b = _vectors(cold), _vectors(eager)
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() >= 0.99999, cosine.min()

    # A fresh process in another root, reading the first root's compile cache: every
    # graph comes from the cache, none is compiled, and the vectors are the cold run's.
    warm_root, warm = _root(tmp_path, "warm")
    done = run_job(
        "embed",
        f"artifact_root={warm_root}",
        "run_id=warm",
        "compile=true",
        f"compile_cache_root={cold_root}",
        *SETS,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    compile = _report(warm, "warm")["compile"]
    assert compile["hit"] is True and compile["key"] == report["compile"]["key"]
    assert compile["graph_cache"]["fx_graph_cache_misses"] == 0, compile
    assert compile["graph_cache"]["fx_graph_cache_hits"] == shapes, compile
    np.testing.assert_array_equal(_vectors(warm), a)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ("static_batches=false", "compile=true needs static_batches=true"),
        ("quantize=int8", "compiled by its own route"),
    ],
)
def test_compile_with_a_setting_it_cannot_run_is_refused_before_any_write(
    tmp_path, extra: str, says: str
) -> None:
    root, store = _root(tmp_path, "r")
    done = run_job("embed", f"artifact_root={root}", "run_id=r", "compile=true", extra, *SETS)
    assert done.returncode == 2, done.stderr[-2000:]
    assert says in done.stderr
    assert not store.exists(layout.embeddings("tiny", "v1", "products"))
