"""The embed job streams: its memory does not grow with the corpus.

CI-sized version of ``bench/embeddings_scale.py`` (100,000 vs 1,000,000 rows): the tiny
model on 10,000 and 30,000 generated rows in shards of 1,000. A job that kept texts,
tokens and vectors of every shard would grow by over 1 KiB a row (over 10 MiB between the
medians the check compares, over the last 20 shards of the big corpus); the tolerances
below are under that, and a run with such a leak planted (every shard's ids and texts,
token ids, batch plan and vectors kept) shows the check catches it. The check reads the memory after each commit, not only the peak: the peak
hides a leak smaller than the forward's transient memory (that run's peak rose by
0.3 MiB over the 20 shards where its memory after a commit rose by ~30)."""

from __future__ import annotations

import re
import statistics
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
MEMORY = re.compile(r"shard \d+ committed: .*, RSS ([\d.]+) MiB, peak RSS ([\d.]+) MiB")


def _corpus(store: ArtifactStore, name: str, rows: int) -> None:
    import pyarrow as pa

    for i, batch in enumerate(iter_corpus_batches(0, rows, SHARD_ROWS)):
        data = parquet_bytes(pa.Table.from_batches([batch]))
        store.write_bytes(f"{layout.corpus(name)}/{layout.part_name(i)}", data)


# The embed job as ``python -m embedfresh.jobs.embed`` runs it, with a per-row leak planted:
# every shard's ids and texts, token ids, batch plan (the padded id and mask arrays) and
# vectors kept to the end. Token ids, plan and vectors alone (about 1 KiB a row here; the
# token ids are 4 bytes a token, one int32 array a shard) moved the check by +9.4 to
# +10.9 MiB here under glibc's moving mmap threshold, but by +4.55 once on CI's host,
# under the line, where malloc placed part of them in memory the process already held.
LEAKY = """
import sys
from embedfresh.core.cli import main_for
from embedfresh.core.config import EmbedConfig
from embedfresh.jobs import embed as job

kept = []
real_read, real_batches, real_embed = job.read_corpus_shard, job.make_batches, job.embed_plan

def leaky_read(*args, **kwargs):
    ids_and_texts = real_read(*args, **kwargs)
    kept.append(ids_and_texts)
    return ids_and_texts

def leaky_batches(token_ids, *args, **kwargs):
    plan = real_batches(token_ids, *args, **kwargs)
    kept.append((token_ids, plan))
    return plan

def leaky_embed(*args, **kwargs):
    vectors = real_embed(*args, **kwargs)
    kept.append(vectors)
    return vectors

job.read_corpus_shard, job.make_batches, job.embed_plan = leaky_read, leaky_batches, leaky_embed
main_for("embed", EmbedConfig, job.embed)
"""


def _embed(root: str, corpus: str, leak: bool = False) -> tuple[list[tuple[float, float]], float]:
    """(RSS, peak RSS) after each committed shard, and the report's peak (MiB). The leaking
    run embeds version v2 (the same weights), so it reuses none of v1's committed shards."""
    version = "v2" if leak else "v1"
    sets = [f"artifact_root={root}", "model=tiny", f"version={version}", f"corpus={corpus}"]
    if leak:
        argv = [sys.executable, "-c", LEAKY]
        for s in [*sets, f"run_id={corpus}-leak"]:
            argv += ["--set", s]
        done = subprocess.run(
            argv, cwd=ROOT, env=job_env(MEASURED), capture_output=True, text=True, timeout=600
        )
    else:  # a new interpreter, as the leaking run's and production's: not a forked one
        done = run_job("embed", *sets, f"run_id={corpus}", env=MEASURED, fresh=True)
    assert done.returncode == 0, done.stderr
    run_id = f"{corpus}-leak" if leak else corpus
    report = ArtifactStore(root).read_json(layout.report("tiny", run_id, f"embed-{corpus}"))
    shards = [(float(now), float(peak)) for now, peak in MEMORY.findall(done.stderr)]
    return shards, report["peak_rss_mib"]


MEASURED = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
"""glibc's mmap threshold kept at its initial 128 KiB in the measured runs, so that the
memory after a commit follows what the job holds, not how malloc's heap fragments. With
the threshold moving (glibc's default) the memory after a commit of a job without a leak
drifted by +3.25 to +5.3 MiB over the check's window (fresh interpreters, 2-core AMD
EPYC, 2026-11-29), and the check's line sat in that noise; fixed, by -0.2 to +1.05 (5
runs). The embed job itself keeps glibc's default: fixing the threshold there cost
~25% of its throughput (minilm, 4,000 rows: 118.8/151.5/132.6 rows/s against
96.2/117.2/88.0, interleaved; the train job fixes it, where it halves the peak,
embedfresh/core/memory.py)."""

GROWTH_LINE = 5.0
"""MiB the memory after a commit may grow over the last 20 shards (:func:`_growth`). As
shipped it moved by -0.2 to +1.05 (5 runs, 2026-11-29, :data:`MEASURED`); with the leak
planted (ids, texts, token ids, batch plans and vectors kept) by +12.3 to +13.15 (3 runs;
10 shards of 1,000 rows between the two medians). A job forked from the fork server is not
measured here: its memory after a commit drifted by up to +6.2 without a leak."""


def _growth(shards: list[tuple[float, float]]) -> float:
    """Growth of the memory after a commit over the last 20 shards: the median of the last
    10 against the median of the 10 before them. The memory after a commit moves by up
    to ~10 MiB from shard to shard with the shard's batch plan and what the prefetch
    thread holds at that moment; medians over 10 shards move by under 2 MiB (7 runs,
    2026-11-27), where the planted leak moves them by 12.3-13.15 MiB (:data:`GROWTH_LINE`)."""
    now = [rss for rss, _ in shards]
    return statistics.median(now[-10:]) - statistics.median(now[-20:-10])


def test_peak_memory_does_not_grow_with_the_corpus(root: str) -> None:
    store = ArtifactStore(root)
    spec = get_spec("tiny")
    weights = cpu_state_dict(versions.build_model(spec, 0))
    for version in ("v1", "v2"):
        versions.publish(store, spec, version, weights, {})
    _corpus(store, "small", 10_000)
    _corpus(store, "big", 30_000)

    small_shards, small_peak = _embed(root, "small")
    big_shards, big_peak = _embed(root, "big")
    assert len(small_shards) == 10 and len(big_shards) == 30
    # Within the big run (no start-up noise between processes), over its last 20 shards:
    # the memory after each commit stays put, where a job that kept any shard's texts,
    # tokens or vectors would climb by ~1 KiB a row. The first shards step up while the
    # prefetch pipeline and the GEMM libraries' per-shape caches fill (by up to 50 MiB
    # over the first 6 shards on an AVX-512 Xeon, 2026-11-27), then stay. The peak within
    # the run is not checked: it moves with the prefetch thread's timing (+15.6 MiB over
    # the last 20 shards once on a 2-core AMD EPYC running the suite and two benches,
    # flat alone) and hides a per-row leak (below).
    assert _growth(big_shards) <= GROWTH_LINE, big_shards
    # Across runs, each process's own peak: 10 shards against 30, both past that step-up
    # (3 shards against 30 failed on a CI host: 686.8 against 710.5 MiB, while the big
    # run was flat over its last 20 shards).
    assert big_peak - small_peak <= 16.0, (small_shards, big_shards)

    # The check can fail: the same big run with a per-row leak planted climbs past it.
    leaked, _ = _embed(root, "big", leak=True)
    assert _growth(leaked) > GROWTH_LINE, leaked
