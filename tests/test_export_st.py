"""``python -m embedfresh.jobs.export_st``: a model version in the sentence-transformers format loads
offline with ``SentenceTransformer(path)`` and gives the embed job's vectors."""

from __future__ import annotations

import os

# Before anything imports huggingface_hub: it reads these once, at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedfresh.core import cli, layout, markers
from embedfresh.core.config import EmbedConfig
from embedfresh.core.parquet import read_parquet
from embedfresh.core.storage import ArtifactStore
from embedfresh.jobs.embed import embed
from embedfresh.jobs.export_st import export_dir, local_copy
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec
from tests.conftest import run_job

MIN_COSINE = 0.99999
# Mixed lengths, languages and one far over both max lengths (truncation must match).
EXTRA = [
    "",
    "hi",
    "Das ist ein schöner Tag in München, die Straße ist ruhig.",
    "无线蓝牙耳机 主动降噪 长续航",
    "🔥🔥 best deal 😀👍 limited offer",
    " ".join(f"item{i} waterproof hiking boots, leather, size {i % 13}" for i in range(40)),
]


def _publish(store: ArtifactStore, name: str) -> None:
    spec = get_spec(name)
    model = versions.build_model(spec, 0)
    if name == "minilm":
        versions.load_base_weights(model)  # the base weights, published as a version
    versions.publish(store, spec, "v1", cpu_state_dict(model), {})


def _corpus(store: ArtifactStore) -> list[str]:
    texts = read_parquet(store, f"{layout.corpus('products')}/part-00000.parquet")
    texts = texts.column("text").to_pylist()[:150] + EXTRA
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": pa.array(range(len(texts)), pa.int64()), "text": texts}), sink)
    store.write_bytes(f"{layout.corpus('mixed')}/part-00000.parquet", sink.getvalue().to_pybytes())
    return texts


def _job_vectors(store: ArtifactStore, model: str) -> np.ndarray:
    t = read_parquet(store, f"embeddings/{model}/v1/mixed/part-00000.parquet")
    assert t.column("id").to_pylist() == list(range(t.num_rows))
    return t.column("embedding").combine_chunks().flatten().to_numpy().reshape(t.num_rows, -1)


# Each model's own length: tiny's 64 position embeddings, MiniLM's max_seq_length.
@pytest.mark.parametrize(("name", "max_len"), [("tiny", 64), ("minilm", 256)])
def test_export_loads_offline_and_reproduces_the_embed_job(
    root: str, tmp_path: Path, name: str, max_len: int
) -> None:
    import huggingface_hub.constants
    from sentence_transformers import SentenceTransformer

    store = ArtifactStore(root)
    _publish(store, name)
    texts = _corpus(store)
    sets = [f"artifact_root={root}", f"model={name}", "version=v1"]
    argv = [a for s in (*sets, "corpus=mixed") for a in ("--set", s)]
    assert cli.run_job("embed", EmbedConfig, embed, argv) == 0

    done = run_job("export_st", *sets)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["max_seq_length"] == max_len
    directory = export_dir(name, "v1")
    assert markers.verify(store, directory).ok
    out = Path(store.path(directory))
    commit_time = (out / "COMMIT").stat().st_mtime_ns
    assert all(p.stat().st_mtime_ns <= commit_time for p in out.rglob("*") if p.is_file())
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == max_len
    assert json.loads((out / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"]
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    # The version itself still verifies: the export is beside its files, not in its marker.
    assert versions.load(store, name, "v1").spec.name == name

    assert huggingface_hub.constants.HF_HUB_OFFLINE
    copy = local_copy(store, name, "v1", tmp_path / "st")
    st = SentenceTransformer(str(copy), device="cpu")
    assert st.max_seq_length == max_len
    ref = st.encode(texts, batch_size=32, convert_to_numpy=True)
    ours = _job_vectors(store, name)
    cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() >= MIN_COSINE, cos.min()

    # Idempotent: a second export leaves the committed one alone.
    again = run_job("export_st", *sets)
    assert again.returncode == 0 and json.loads(again.stdout)["skipped"] is True


def test_export_of_a_missing_version_exits_2(root: str) -> None:
    done = run_job("export_st", f"artifact_root={root}", "model=tiny", "version=nope")
    assert done.returncode == 2 and "does not exist" in done.stderr
