"""The embed job streams: its peak memory does not grow with the corpus.

CI-sized version of ``bench/embeddings_scale.py`` (100,000 vs 1,000,000 rows): the tiny
model on 3,000 and 30,000 generated rows in shards of 1,000. A job that kept texts,
tokens or vectors of every shard would grow by about 1 KiB a row (~20 MiB over the
last 20 shards of the big corpus); the tolerances below are under that, and a run with
such a leak planted (every shard's token ids and batch plan kept) shows the check
catches it. The peak hides a leak smaller than the forward's transient memory: about
20 MiB of leak over the first 10 shards vanished under it in that run."""

from __future__ import annotations

import re
import subprocess
import sys

from embedfresh.core import layout
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.data.generate import iter_corpus_batches, parquet_bytes
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec
from tests.conftest import ROOT, job_env, run_job

SHARD_ROWS = 1_000
PEAK = re.compile(r"shard \d+ committed: .*peak RSS ([\d.]+) MiB")


def _corpus(store: ArtifactStore, name: str, rows: int) -> None:
    import pyarrow as pa

    for i, batch in enumerate(iter_corpus_batches(0, rows, SHARD_ROWS)):
        data = parquet_bytes(pa.Table.from_batches([batch]))
        store.write_bytes(f"{layout.corpus(name)}/{layout.part_name(i)}", data)


# The embed job as ``python -m embedfresh.jobs.embed`` runs it, with a per-row leak planted:
# every shard's token ids and batch plan (the token lists and the padded id and mask
# arrays, about 1 KiB a row here) kept to the end.
LEAKY = """
import sys
from embedfresh.core.cli import main_for
from embedfresh.core.config import EmbedConfig
from embedfresh.jobs import embed as job

kept = []
real = job.make_batches

def leaky(token_ids, *args, **kwargs):
    plan = real(token_ids, *args, **kwargs)
    kept.append((token_ids, plan))
    return plan

job.make_batches = leaky
main_for("embed", EmbedConfig, job.embed)
"""


def _embed(root: str, corpus: str, leak: bool = False) -> tuple[list[float], float]:
    """Peak RSS after each committed shard, and the report's peak (MiB). The leaking run
    embeds version v2 (the same weights), so it reuses none of v1's committed shards."""
    version = "v2" if leak else "v1"
    sets = [f"artifact_root={root}", "model=tiny", f"version={version}", f"corpus={corpus}"]
    if leak:
        argv = [sys.executable, "-c", LEAKY]
        for s in [*sets, f"run_id={corpus}-leak"]:
            argv += ["--set", s]
        done = subprocess.run(
            argv, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=600
        )
    else:
        done = run_job("embed", *sets, f"run_id={corpus}")
    assert done.returncode == 0, done.stderr
    run_id = f"{corpus}-leak" if leak else corpus
    report = ArtifactStore(root).read_json(layout.report("tiny", run_id, "embed"))
    return [float(m) for m in PEAK.findall(done.stderr)], report["peak_rss_mib"]


def test_peak_memory_does_not_grow_with_the_corpus(root: str) -> None:
    store = ArtifactStore(root)
    spec = get_spec("tiny")
    weights = cpu_state_dict(versions.build_model(spec, 0))
    for version in ("v1", "v2"):
        versions.publish(store, spec, version, weights, {})
    _corpus(store, "small", 3_000)
    _corpus(store, "big", 30_000)

    small_shards, small_peak = _embed(root, "small")
    big_shards, big_peak = _embed(root, "big")
    assert len(small_shards) == 3 and len(big_shards) == 30
    # Within the big run (no start-up noise between processes): flat over its last 20
    # shards, where a non-streaming job would keep climbing. The first shards may step up
    # while the prefetch pipeline and oneDNN's per-shape kernel cache fill (up to 13 MiB
    # by the 4th shard, measured on an AVX2 host), then the peak stays put.
    assert big_shards[-1] - big_shards[9] <= 8.0, big_shards
    # Across runs (each process's own peak; allocator noise of a few MiB either way).
    assert big_peak - small_peak <= 16.0, (small_peak, big_peak)

    # The check can fail: the same big run with a per-row leak planted climbs past it.
    # (measured: +24 MiB over the last 20 shards, as shipped +0).
    leaked, _ = _embed(root, "big", leak=True)
    assert leaked[-1] - leaked[9] > 8.0, leaked
