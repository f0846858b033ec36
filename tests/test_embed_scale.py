"""The embed job streams: its peak memory does not grow with the corpus.

CI-sized version of ``bench/embeddings_scale.py`` (100,000 vs 1,000,000 rows): the tiny
model on 3,000 and 30,000 generated rows in shards of 1,000. A job that kept texts,
tokens or vectors of every shard would grow by about 1 KiB a row (~27 MiB over the
last 27 shards of the big corpus); the tolerances below are under that."""

from __future__ import annotations

import re

from embedfresh.core import layout
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.data.generate import iter_corpus_batches, parquet_bytes
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec
from tests.conftest import run_job

SHARD_ROWS = 1_000
PEAK = re.compile(r"shard \d+ committed: .*peak RSS ([\d.]+) MiB")


def _corpus(store: ArtifactStore, name: str, rows: int) -> None:
    import pyarrow as pa

    for i, batch in enumerate(iter_corpus_batches(0, rows, SHARD_ROWS)):
        data = parquet_bytes(pa.Table.from_batches([batch]))
        store.write_bytes(f"{layout.corpus(name)}/{layout.part_name(i)}", data)


def _embed(root: str, corpus: str) -> tuple[list[float], float]:
    """Peak RSS after each committed shard, and the report's peak (MiB)."""
    sets = [f"artifact_root={root}", "model=tiny", "version=v1", f"corpus={corpus}"]
    done = run_job("embed", *sets, f"run_id={corpus}")
    assert done.returncode == 0, done.stderr
    report = ArtifactStore(root).read_json(layout.report("tiny", corpus, "embed"))
    return [float(m) for m in PEAK.findall(done.stderr)], report["peak_rss_mib"]


def test_peak_memory_does_not_grow_with_the_corpus(root: str) -> None:
    store = ArtifactStore(root)
    spec = get_spec("tiny")
    versions.publish(store, spec, "v1", cpu_state_dict(versions.build_model(spec, 0)), {})
    _corpus(store, "small", 3_000)
    _corpus(store, "big", 30_000)

    small_shards, small_peak = _embed(root, "small")
    big_shards, big_peak = _embed(root, "big")
    assert len(small_shards) == 3 and len(big_shards) == 30
    # Within the big run (no start-up noise between processes): flat after the first
    # shards, where a non-streaming job would keep climbing.
    assert big_shards[-1] - big_shards[2] <= 8.0, big_shards
    # Across runs (each process's own peak; allocator noise of a few MiB either way).
    assert big_peak - small_peak <= 16.0, (small_peak, big_peak)
