"""The verifier's memory does not grow with the corpus, and its duplicate check still
finds an id repeated across two shards.

The memory test runs ``embed_verify`` in a fresh process on corpora of ``SHARDS`` and
``10 * SHARDS`` shards (same shard size) and compares the two processes' peak RSS. It
is parametrised with a planted per-row leak (every shard's ids kept in a list, which is
what the verifier used to do for its duplicate check: 8 bytes a row for int64 ids): the
leaking run must show the growth, so the tolerance is proven small enough to catch it.
The outputs are written directly (random unit vectors, the real part layout and commit
markers), so no model runs: a few seconds per process.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedfresh.core import layout, markers
from embedfresh.core.config import EmbedConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.shard_ids import CrossShardIds
from embedfresh.core.shards import MANIFEST, commit_name, id_type, reuse_key
from embedfresh.core.storage import ArtifactStore
from embedfresh.jobs.embed_verify import verify
from tests.conftest import ROOT, job_env

HIDDEN = 4
SHARDS = 20
ROWS = 5_000
TOLERANCE_MIB = 3.0
"""Allowed growth of peak RSS from SHARDS to 10 * SHARDS shards. The planted leak adds
8 bytes x 9 x SHARDS x ROWS = 6.9 MiB; the manifest's entry per part is ~0.1 KiB."""

# Many scripts, lengths and widths: Latin, accented, Greek, Cyrillic, Hebrew, Arabic,
# Devanagari, Thai, CJK, Hangul, emoji (astral plane), combining marks.
SCRIPTS = [
    "sku",
    "Ærø",
    "αβγ",
    "ДЖЯ",
    "שלום",
    "مرحبا",
    "नमस्ते",
    "สวัสดี",
    "日本語",
    "한국어",
    "🙂🚀",
    "é",
]


def _parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _publish_version(store: ArtifactStore) -> dict:
    directory = layout.model_version("tiny", "v1")
    markers.publish(store, directory, {"weights.bin": b"not a model"}, meta={"version": "v1"})
    return markers.read_marker(store, directory)


def _write(store: ArtifactStore, corpus: str, shards: list[np.ndarray], rng: np.random.Generator):
    """Corpus shards with these ids, and committed embedding parts for them."""
    version = markers.read_marker(store, layout.model_version("tiny", "v1")) or _publish_version(
        store
    )
    out = layout.embeddings("tiny", "v1", corpus)
    for i, ids in enumerate(shards):
        rel = f"{layout.corpus(corpus)}/{layout.part_name(i)}"
        texts = pa.array([f"text {k}" for k in range(len(ids))], pa.string())
        store.write_bytes(
            rel, _parquet(pa.table({"id": pa.array(ids, id_type(ids)), "text": texts}))
        )
        vectors = rng.standard_normal((len(ids), HIDDEN)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        part = pa.table(
            {
                "id": pa.array(ids, id_type(ids)),
                "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), HIDDEN),
                "model_version": pa.array(["v1"] * len(ids), pa.string()),
            }
        )
        key = reuse_key(store=store, source_rel=rel, version_marker=version, settings={})
        markers.publish(
            store,
            out,
            {layout.part_name(i): _parquet(part)},
            meta={"version": "v1", "shard": i, "rows": len(ids), "reuse_key": key},
            name=commit_name(i),
        )


def _int_shards(count: int, rows: int) -> list[np.ndarray]:
    return [np.arange(i * rows, (i + 1) * rows, dtype=np.int64) for i in range(count)]


def _cfg(root: str, corpus: str) -> EmbedConfig:
    return EmbedConfig(artifact_root=root, model="tiny", version="v1", corpus=corpus)


# Runs verify in a fresh process, optionally with the planted leak, and prints the peak
# RSS of the verify call alone (KiB): the high-water mark is reset after the imports
# (``clear_refs`` 5), whose own peak would otherwise hide a leak of a few MiB.
RUNNER = """
import re, sys
from embedfresh.core.config import EmbedConfig
from embedfresh.jobs import embed_verify
root, corpus, leak = sys.argv[1], sys.argv[2], sys.argv[3] == "leak"
kept = []
if leak:
    add = embed_verify.CrossShardIds.add
    def leaky(self, shard, ids):
        kept.append(ids.copy())
        add(self, shard, ids)
    embed_verify.CrossShardIds.add = leaky
cfg = EmbedConfig(artifact_root=root, model="tiny", version="v1", corpus=corpus)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
assert embed_verify.verify(cfg)["status"] == "ok"
with open("/proc/self/status") as f:
    print(re.search(r"VmHWM:\\s+(\\d+) kB", f.read()).group(1))
"""


def _peak_mib(root: str, corpus: str, leak: bool) -> float:
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, root, corpus, "leak" if leak else "none"],
        cwd=ROOT,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1]) / 1024


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = f"file://{tmp_path_factory.mktemp('flat')}"
    store = ArtifactStore(root)
    rng = np.random.default_rng(0)
    _write(store, "small", _int_shards(SHARDS, ROWS), rng)
    _write(store, "big", _int_shards(10 * SHARDS, ROWS), rng)
    return root


@pytest.mark.parametrize("leak", [False, True], ids=["as-shipped", "planted-per-row-leak"])
def test_verify_peak_memory_does_not_grow_with_the_number_of_shards(
    corpora: str, leak: bool
) -> None:
    small = _peak_mib(corpora, "small", leak)
    big = _peak_mib(corpora, "big", leak)
    growth = big - small
    if leak:
        # The check must be able to fail: a leak of 8 bytes a row is over the tolerance.
        assert growth > TOLERANCE_MIB, (small, big)
    else:
        assert growth <= TOLERANCE_MIB, (small, big)


def test_an_id_repeated_across_two_shards_is_found_in_any_script(tmp_path: Path) -> None:
    root = f"file://{tmp_path}"
    store = ArtifactStore(root)
    rng = np.random.default_rng(1)
    # 30 shards of string ids of every script (shards differ in their longest id, so the
    # same id sits in arrays of different widths); shard 7 repeats one id of shard 23.
    shards = []
    for i in range(30):
        ids = [f"{SCRIPTS[(i + k) % len(SCRIPTS)]}-{i}-{k}" + "x" * (i % 5) for k in range(50)]
        shards.append(np.array(ids))
    repeated = str(shards[23][17])
    shards[7][3] = repeated
    _write(store, "strings", shards, rng)
    with pytest.raises(BadInputError) as err:
        verify(_cfg(root, "strings"))
    message = str(err.value)
    assert "1 ids appear in more than one corpus shard" in message
    assert f"(part-00007.parquet, part-00023.parquet; e.g. [{repeated!r}])" in message
    assert not store.exists(f"{layout.embeddings('tiny', 'v1', 'strings')}/{MANIFEST}")

    # Without the repeat the same corpus verifies, and the manifest lists every part.
    shards[7][3] = "ünique-🙂"
    _write(store, "strings-ok", shards, rng)
    assert verify(_cfg(root, "strings-ok"))["rows"] == 30 * 50
    manifest = json.loads(
        store.read_bytes(f"{layout.embeddings('tiny', 'v1', 'strings-ok')}/{MANIFEST}")
    )
    assert len(manifest["parts"]) == 30


@pytest.mark.parametrize("kind", ["int", "str"])
def test_partitions_over_the_budget_are_split_and_still_find_every_repeat(
    tmp_path: Path, kind: str
) -> None:
    rng = np.random.default_rng(2)
    values = rng.permutation(40_000)
    ids = values if kind == "int" else np.array([f"{SCRIPTS[v % 12]}{v}" for v in values])
    shards = np.array_split(ids, 40)
    # Repeats across shards: ids of shard 0 in shard 39, of shard 5 in shards 6 and 30.
    planted = [shards[0][0], shards[0][1], shards[5][2]]
    shards[39] = np.concatenate([shards[39], shards[0][:2]])
    shards[6] = np.concatenate([shards[6], shards[5][2:3]])
    shards[30] = np.concatenate([shards[30], shards[5][2:3]])
    # A tiny budget forces every partition through one or more splits.
    with CrossShardIds(str(tmp_path), budget_bytes=4096, partitions=8) as seen:
        for i, shard in enumerate(shards):
            seen.add(i, shard)
        found = seen.duplicates()
        assert seen.splits > 8
    assert found.count == 3
    assert found.examples == sorted(v.item() if kind == "int" else str(v) for v in planted)
    assert found.shards == [0, 5, 6, 30, 39]
    assert os.listdir(tmp_path) == []  # the partitions are removed

    with CrossShardIds(str(tmp_path)) as seen:
        for i, shard in enumerate(np.array_split(ids, 40)):
            seen.add(i, shard)
        assert seen.duplicates().count == 0


def test_mixed_id_types_are_flagged_not_compared(tmp_path: Path) -> None:
    with CrossShardIds(str(tmp_path)) as seen:
        seen.add(0, np.array([1, 2], dtype=np.int64))
        assert not seen.mixed
        seen.add(1, np.array(["1", "2"]))
        seen.add(2, np.array(["3"]))
        assert seen.mixed and seen.duplicates().count == 0
        # The first shard of each type, in the order met: the two a message names.
        assert seen.first_shard == {"int64": 0, "string": 1}
