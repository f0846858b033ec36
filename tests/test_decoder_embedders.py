"""Decoder embedding models (Qwen3-Embedding, gte-Qwen2, e5-mistral: last-token pooling,
left padding, an instruction before queries) through the same door as any model: a team's
sentence-transformers directory published with ``publish_model``, its corpus embedded,
its queries encoded as a release's query encoder does, its export loaded back, and
trained, evaluated and gated, on small random Qwen3 and Llama models built by the test
(no download). Vectors equal sentence-transformers' (cosine >= 0.99999 per row) on texts
of several scripts, most over 64 tokens."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedfresh.core import layout
from embedfresh.core.storage import ArtifactStore
from tests.conftest import DAY1, run_job, write_data
from tests.own_model import (
    CORPUS,
    DECODER_MAX_SEQ_LENGTH,
    EOS,
    build_own_decoder,
    cosines,
    embed_and_read,
    last_json,
    write_corpus,
)

MIN_COSINE = 0.99999


def _texts() -> list[str]:
    """Each script short, over 64 tokens, and over the model's 256 (truncated)."""
    texts = []
    for i, sentence in enumerate(CORPUS):
        texts += [sentence, " ".join([sentence] * (4 + i)), " ".join([sentence] * 30)]
    return texts


@pytest.mark.parametrize("architecture", ["qwen3", "llama"])
def test_decoder_embedder_as_sentence_transformers_embeds_it(
    architecture: str, tmp_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    from embedfresh.jobs.export_st import local_copy
    from embedfresh.ml.embedding.query import ReleaseEncoder

    source = build_own_decoder(tmp_path / "st", architecture)
    st = SentenceTransformer(str(source), device="cpu")
    assert st.tokenizer.padding_side == "left"
    texts = _texts()
    tokens = np.array([len(t) for t in st.tokenizer(texts, truncation=False)["input_ids"]])
    assert (tokens > 64).sum() >= len(texts) // 2 and (tokens > DECODER_MAX_SEQ_LENGTH).any()
    root = f"file://{tmp_path / 'store'}"
    store = ArtifactStore(root)
    ids = write_corpus(store, "catalogue", texts, "sku-")
    common = [f"artifact_root={root}", "model=dec"]

    published = last_json(run_job("publish_model", *common, f"source={source}"))
    assert published["max_seq_length"] == DECODER_MAX_SEQ_LENGTH
    meta = store.read_json(f"{layout.model_version('dec', 'base')}/model.json")
    assert meta["spec"]["pooling"] == "lasttoken"
    assert meta["spec"]["prompts"]["query"].startswith("Instruct: ")

    out_ids, ours = embed_and_read(root, "dec", "base", "catalogue")
    assert out_ids == ids
    report = store.read_json("runs/dec/manual/reports/embed-catalogue.json")
    assert report["truncated"] == int((tokens > DECODER_MAX_SEQ_LENGTH).sum())
    cos = cosines(ours, st.encode_document(texts, batch_size=8))
    assert cos.min() >= MIN_COSINE, cos

    # Queries as the release's query encoder embeds them: after the model's instruction.
    manifest = store.read_json(f"{layout.embeddings('dec', 'base', 'catalogue')}/_MANIFEST.json")
    encoder = ReleaseEncoder(store, "dec", "base", "catalogue", manifest["settings"])
    queries = [CORPUS[1][:20], "wireless headphones", CORPUS[6]]
    cos = cosines(encoder.queries(queries), st.encode_query(queries))
    assert cos.min() >= MIN_COSINE, cos
    assert cosines(encoder.queries(queries), st.encode(queries)).min() < 0.9999  # prompt used

    # The export is a sentence-transformers directory that gives the job's vectors.
    last_json(run_job("export_st", *common, "version=base"))
    copy = local_copy(store, "dec", "base", tmp_path / "export")
    exported = SentenceTransformer(str(copy), device="cpu")
    assert exported.tokenizer.pad_token == EOS
    assert cosines(ours, exported.encode_document(texts, batch_size=8)).min() >= MIN_COSINE


def test_a_decoder_trains_evaluates_and_gates_unchanged(tmp_path: Path) -> None:
    """A transformers decoder directory (no sentence-transformers files: last-token
    pooling, which such models are trained for, and said in the log) through train,
    evaluate and the gate against its untrained head (retrieval only)."""
    source = build_own_decoder(tmp_path / "hf", "qwen3", sentence_transformers=False)
    root = f"file://{tmp_path / 'store'}"
    write_data(root)
    common = [f"artifact_root={root}", "model=dec"]
    done = run_job("publish_model", *common, f"source={source}")
    last_json(done)
    assert "last-token pooling" in done.stderr
    run = [*common, "run_id=r1"]
    trained = last_json(run_job("train", *run, f"data_interval_start={DAY1}", "max_steps=3"))
    assert trained["steps"] == 3 and np.isfinite(trained["final_loss"])
    assert last_json(run_job("evaluate", *run))["metrics"]["ndcg_at_10"] > 0
    head = '["ndcg_at_10", "accuracy", "auc", "log_loss"]'
    gated = last_json(run_job("gate", *run, "refusal_exits=false", f"metrics={head}"))
    assert [m["metric"] for m in gated["metrics"]] == ["ndcg_at_10"]
    assert set(gated["metrics_not_compared"]) == {"accuracy", "auc", "log_loss"}


def test_a_tokenizer_that_does_not_append_eos_is_refused_with_the_fix(tmp_path: Path) -> None:
    """Last-token pooling would read each text's last word: refused before any write,
    with the command that saves a tokenizer appending EOS; after it, publish works."""
    source = build_own_decoder(tmp_path / "st", "llama", appends_eos=False)
    root = f"file://{tmp_path / 'store'}"
    done = run_job("publish_model", f"artifact_root={root}", "model=dec", f"source={source}")
    assert done.returncode == 2, done.stderr
    assert "does not append the EOS token" in done.stderr
    assert not (tmp_path / "store").exists()
    command = done.stderr.split("Save a tokenizer that appends it: ", 1)[1].splitlines()[0]
    assert command.startswith('python -c "') and "add_eos_token=True" in command
    code = command.removeprefix('python -c "').removesuffix('"')
    fixed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert fixed.returncode == 0, fixed.stderr
    last_json(run_job("publish_model", f"artifact_root={root}", "model=dec", f"source={source}"))
