"""A team's own corpus through the embed job as a new user runs it: no ``max_length``
given, long texts in many scripts, string ids, and re-runs after something changed.

- Right by default: the job cuts texts at the model's own ``max_seq_length`` (256 for
  all-MiniLM-L6-v2), so every row equals ``SentenceTransformer.encode``; at 64 tokens
  (the training preset's length) many rows do not (the negative control).
- Never stale: a committed shard is reused only when its corpus shard, the version and
  every vector-changing setting are unchanged, and the report says why one was redone.
- String ids (SKUs, UUIDs) go through embed and verify with their type.
"""

from __future__ import annotations

import os

# Before anything imports huggingface_hub: it reads these once, at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import io
import json
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedfresh.core import layout
from embedfresh.core.parquet import read_parquet
from embedfresh.core.storage import ArtifactStore
from tests.conftest import run_job

MIN_COSINE = 0.99999

# One sentence per script; texts repeat them to lengths short, past 128 and past 256
# tokens of MiniLM's WordPiece tokenizer (asserted below, not assumed).
SCRIPTS = {
    "latin": "Größe 44, wasserdichte Wanderschuhe aus Leder für Übergangszeiten; café crème, "
    "naïve œuvre, Łódź, Žluťoučký kůň. ",
    "arabic": "سماعات لاسلكية مع خاصية إلغاء الضوضاء وعمر بطارية طويل للاستخدام اليومي. ",
    "vietnamese": "Tai nghe không dây chống ồn, pin dùng lâu, phù hợp khi chạy bộ và đi làm. ",
    "greek": "Ασύρματα ακουστικά με ακύρωση θορύβου και μεγάλη διάρκεια μπαταρίας. ",
    "thai": "หูฟังไร้สายตัดเสียงรบกวน แบตเตอรี่ใช้งานได้นาน เหมาะสำหรับการวิ่ง ",
    "devanagari": "वायरलेस हेडफ़ोन, शोर रद्द करने वाला, लंबी बैटरी, दौड़ने के लिए उपयुक्त। ",
    "urdu": "وائرلیس ہیڈ فون، شور ختم کرنے والا، لمبی بیٹری، دوڑنے کے لیے موزوں۔ ",
    "cjk": "无线蓝牙耳机，主动降噪，长续航，适用于跑步和通勤。防水ハイキングブーツ、軽量。 ",
}
REPEATS = (1, 4, 9, 16)


def _texts() -> list[str]:
    out = []
    for sentence in SCRIPTS.values():
        out += [(sentence * r).strip() for r in REPEATS]
    out += [" ".join(sentence for sentence in SCRIPTS.values())] * 1
    return out


def _write_shards(store: ArtifactStore, corpus: str, shards: list[tuple[list, list[str]]]) -> None:
    for i, (ids, texts) in enumerate(shards):
        sink = io.BytesIO()
        pq.write_table(pa.table({"id": ids, "text": texts}), sink)
        store.write_bytes(f"{layout.corpus(corpus)}/{layout.part_name(i)}", sink.getvalue())


def _vectors(store: ArtifactStore, model: str, version: str, corpus: str, n: int) -> pa.Table:
    out = layout.embeddings(model, version, corpus)
    return pa.concat_tables(read_parquet(store, f"{out}/{layout.part_name(i)}") for i in range(n))


def _matrix(table: pa.Table) -> np.ndarray:
    return table.column("embedding").combine_chunks().flatten().to_numpy().reshape(len(table), -1)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _part_bytes(store: ArtifactStore, model: str, version: str, corpus: str, n: int) -> list:
    out = layout.embeddings(model, version, corpus)
    return [store.read_bytes(f"{out}/{layout.part_name(i)}") for i in range(n)]


@pytest.fixture
def minilm_v1(tmp_path: Path) -> str:
    from embedfresh.ml.checkpoint import cpu_state_dict
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec

    root = f"file://{tmp_path / 'store'}"
    spec = get_spec("minilm")
    model = versions.build_model(spec, 0)
    versions.load_base_weights(model)
    versions.publish(ArtifactStore(root), spec, "v1", cpu_state_dict(model), {})
    return root


def test_defaults_give_sentence_transformers_vectors_and_reuse_only_what_is_current(
    minilm_v1: str, tmp_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    from embedfresh.jobs.export_st import local_copy
    from embedfresh.ml.model.presets import minilm_dir

    root, store = minilm_v1, ArtifactStore(minilm_v1)
    texts = _texts()
    st = SentenceTransformer(str(minilm_dir()), device="cpu")
    assert st.max_seq_length == 256
    tokens = np.array([len(t) for t in st.tokenizer(texts, truncation=False)["input_ids"]])
    assert (tokens > 128).sum() >= 12, tokens
    assert (tokens > 256).sum() >= 6, tokens
    assert (tokens <= 64).sum() >= 6, tokens

    # Three shards, string ids like a catalogue's SKUs.
    ids = [f"SKU-{i:04d}-{s[:2]}" for i, s in enumerate(texts)]
    cut = [0, 12, 24, len(texts)]
    shards = [(ids[a:b], texts[a:b]) for a, b in zip(cut, cut[1:], strict=False)]
    _write_shards(store, "world", shards)
    sets = [f"artifact_root={root}", "model=minilm", "version=v1", "corpus=world"]

    # 1. Defaults: the model's own length (256), vectors equal sentence-transformers'.
    done = run_job("embed", *sets)
    assert done.returncode == 0, done.stderr
    over = int((tokens > 256).sum())
    assert f"{over} of {len(texts)} texts were truncated at 256 tokens" in done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["truncated"] == over
    report = store.read_json("runs/minilm/manual/reports/embed-world.json")
    assert report["max_length"] == report["model_max_seq_length"] == 256
    assert report["truncated"] == over
    per_shard = [int((tokens[a:b] > 256).sum()) for a, b in zip(cut, cut[1:], strict=False)]
    assert report["truncated_per_shard"] == {str(i): c for i, c in enumerate(per_shard)}
    assert run_job("embed_verify", *sets).returncode == 0

    table = _vectors(store, "minilm", "v1", "world", 3)
    assert table.schema.field("id").type == pa.string()
    assert table.column("id").to_pylist() == ids
    ours = _matrix(table)
    theirs = st.encode(texts, batch_size=16, convert_to_numpy=True)
    cos = _cosines(ours, theirs)
    assert cos.min() >= MIN_COSINE, f"min cosine {cos.min():.8f} ({texts[int(cos.argmin())][:30]})"

    # The exported model reproduces the job's vectors (same default length).
    export = run_job("export_st", f"artifact_root={root}", "model=minilm", "version=v1")
    assert export.returncode == 0, export.stderr
    assert json.loads(export.stdout.strip().splitlines()[-1])["max_seq_length"] == 256
    exported = SentenceTransformer(
        str(local_copy(store, "minilm", "v1", tmp_path / "st")), device="cpu"
    )
    assert _cosines(ours, exported.encode(texts, batch_size=16)).min() >= MIN_COSINE

    # 2. Nothing changed: every shard reused, its bytes untouched.
    before = _part_bytes(store, "minilm", "v1", "world", 3)
    again = run_job("embed", *sets)
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout.strip().splitlines()[-1])
    assert summary["shards_skipped"] == [0, 1, 2] and summary["shards_done"] == []
    assert _part_bytes(store, "minilm", "v1", "world", 3) == before

    # 3. One text of shard 1 changed: exactly that shard is recomputed, and says why.
    changed = list(shards[1][1])
    changed[3] = "Ελληνικά: νέα περιγραφή προϊόντος, αδιάβροχα παπούτσια πεζοπορίας."
    _write_shards(store, "world", [shards[0], (shards[1][0], changed), shards[2]])
    # The verifier refuses the stale part before the job has run again.
    stale = run_job("embed_verify", *sets)
    assert stale.returncode == 2 and "part-00001.parquet: stale" in stale.stderr
    redo = run_job("embed", *sets)
    assert redo.returncode == 0, redo.stderr
    summary = json.loads(redo.stdout.strip().splitlines()[-1])
    assert summary["shards_done"] == [1] and summary["shards_skipped"] == [0, 2]
    report = store.read_json("runs/minilm/manual/reports/embed-world.json")
    assert report["shards_recomputed"] == [{"shard": 1, "reason": "the corpus shard changed"}]
    after = _part_bytes(store, "minilm", "v1", "world", 3)
    assert after[0] == before[0] and after[2] == before[2] and after[1] != before[1]
    row = _vectors(store, "minilm", "v1", "world", 3).slice(12 + 3, 1)
    assert _cosines(_matrix(row), st.encode([changed[3]]))[0] >= MIN_COSINE
    assert run_job("embed_verify", *sets).returncode == 0

    # 4. max_length=64 recomputes all three, and (negative control) no longer matches.
    short = run_job("embed", *sets, "max_length=64")
    assert short.returncode == 0, short.stderr
    summary = json.loads(short.stdout.strip().splitlines()[-1])
    assert summary["shards_done"] == [0, 1, 2] and summary["shards_recomputed"] == [0, 1, 2]
    report = store.read_json("runs/minilm/manual/reports/embed-world.json")
    assert {r["reason"] for r in report["shards_recomputed"]} == {"max_length 256 -> 64"}
    texts[12 + 3] = changed[3]
    cos64 = _cosines(_matrix(_vectors(store, "minilm", "v1", "world", 3)), st.encode(texts))
    assert (cos64 < 0.999).sum() >= 12, np.sort(cos64)[:5]
    assert run_job("embed_verify", *sets).returncode == 0

    # 5. One shard redone at another length: the verifier refuses a manifest over mixed
    #    settings (vectors cut at 64 and at 128 tokens do not compare).
    assert run_job("embed", *sets, "max_length=128", "shards=[1]").returncode == 0
    mixed = run_job("embed_verify", *sets)
    assert mixed.returncode == 2 and "embedded with different settings" in mixed.stderr


def test_integer_and_string_ids_keep_their_type_and_mixed_ids_are_refused(root: str) -> None:
    """The tiny demo version, a UUID corpus and a corpus mixing id types."""
    store = ArtifactStore(root)
    version = "v-ids"
    from embedfresh.ml.checkpoint import cpu_state_dict
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec

    spec = get_spec("tiny")
    versions.publish(store, spec, version, cpu_state_dict(versions.build_model(spec, 0)), {})
    texts = [f"product {i}: waterproof boots, size {i % 13}" for i in range(30)]
    uuids = [str(uuid.UUID(int=i * 7919 + 1)) for i in range(30)]
    _write_shards(store, "uuids", [(uuids[:15], texts[:15]), (uuids[15:], texts[15:])])
    sets = [f"artifact_root={root}", "model=tiny", f"version={version}", "corpus=uuids"]
    assert run_job("embed", *sets).returncode == 0
    assert run_job("embed_verify", *sets).returncode == 0
    table = _vectors(store, "tiny", version, "uuids", 2)
    assert table.schema.field("id").type == pa.string()
    assert table.column("id").to_pylist() == uuids

    # A UUID repeated across shards is refused by the job (exit 2), naming it.
    dup = [(uuids[:15], texts[:15]), ([*uuids[15:29], uuids[0]], texts[15:])]
    _write_shards(store, "dups", dup)
    refused = run_job("embed", *sets[:3], "corpus=dups")
    assert refused.returncode == 2 and uuids[0] in refused.stderr

    # One corpus, one id type.
    _write_shards(store, "mixed", [(uuids[:15], texts[:15]), (list(range(15)), texts[15:])])
    mixed = run_job("embed", *sets[:3], "corpus=mixed")
    assert mixed.returncode == 2 and "one id type" in mixed.stderr
    assert "part-00001.parquet has int64 ids, shard part-00000.parquet has string" in mixed.stderr
    # Embedded by two tasks that each see one type (an array's children), the verifier
    # refuses the corpus and names the first shard of each type.
    for shard in (0, 1):
        assert run_job("embed", *sets[:3], "corpus=mixed", f"shards=[{shard}]").returncode == 0
    verified = run_job("embed_verify", *sets[:3], "corpus=mixed")
    assert verified.returncode == 2
    expected = "mix int64 and string ids (first of each: part-00000.parquet string, part-00001"
    assert expected in verified.stderr


def test_a_length_beyond_the_model_or_a_missing_version_is_refused_before_any_write(
    root: str,
) -> None:
    from embedfresh.ml.checkpoint import cpu_state_dict
    from embedfresh.ml.model import versions
    from embedfresh.ml.model.presets import get_spec

    store = ArtifactStore(root)
    spec = get_spec("tiny")  # max_position_embeddings 64: its own length
    versions.publish(store, spec, "v1", cpu_state_dict(versions.build_model(spec, 0)), {})

    before = sorted(store.fs.find(store.path("")))
    too_long = run_job("embed", f"artifact_root={root}", "version=v1", "max_length=65")
    assert too_long.returncode == 2
    assert (
        "max_length 65 exceeds the max_position_embeddings (64) of model 'tiny'" in too_long.stderr
    )
    missing = run_job("embed", f"artifact_root={root}", "version=v2")
    assert missing.returncode == 2
    assert "model version v2 of 'tiny' does not exist" in missing.stderr
    assert "committed versions: v1)" in missing.stderr
    assert sorted(store.fs.find(store.path(""))) == before
