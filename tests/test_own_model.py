"""A team's own model through every job, as a team would run it: a sentence-transformers
directory of another architecture (DistilBERT: the generic transformers path) and
shape (its own cased tokenizer, 48-wide, ``max_seq_length`` 384) published as a base
version, embedded, trained from, evaluated, gated, promoted, embedded again and
exported, each step checked against sentence-transformers itself; a BERT-type one of
its own on the fast packed path; and the directories this project must refuse, each
with the reason and exit 2."""

from __future__ import annotations

import os

# Before anything imports huggingface_hub: it reads these once, at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedfresh.core import layout
from embedfresh.core.parquet import read_parquet
from embedfresh.core.storage import ArtifactStore
from tests.conftest import DAY1, run_job
from tests.own_model import (
    CORPUS,
    MAX_SEQ_LENGTH,
    build_own_model,
    cosines,
    embed_and_read,
    last_json,
    write_corpus,
)

MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def own_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """model_type distilbert: not BERT, so the generic path."""
    return build_own_model(tmp_path_factory.mktemp("own") / "acme-st", "distilbert")


@pytest.fixture(scope="module")
def own_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_own_model(tmp_path_factory.mktemp("own-bert") / "acme-bert-st", "bert")


@pytest.fixture(scope="module")
def own_bert_cls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CLS pooling, as BGE models use."""
    return build_own_model(tmp_path_factory.mktemp("own-cls") / "cls-st", "bert", pooling="cls")


def _texts(st) -> list[str]:
    """Several scripts; short, over 256 and over 384 tokens of the model's own tokenizer."""
    texts = []
    for i, sentence in enumerate(CORPUS):
        texts += [sentence, " ".join([sentence] * (6 + 2 * i)), " ".join([sentence] * 40)]
    return texts


def test_own_model_published_embedded_and_exported_like_sentence_transformers(
    own_model: Path, root: str, tmp_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    from embedfresh.jobs.export_st import local_copy

    store = ArtifactStore(root)
    st = SentenceTransformer(str(own_model), device="cpu")
    assert st.max_seq_length == MAX_SEQ_LENGTH
    texts = _texts(st)
    tokens = np.array([len(t) for t in st.tokenizer(texts, truncation=False)["input_ids"]])
    assert (tokens > 256).sum() >= 4 and (tokens > MAX_SEQ_LENGTH).sum() >= 4, tokens
    assert ((tokens > 256) & (tokens <= MAX_SEQ_LENGTH)).sum() >= 2, tokens
    ids = write_corpus(store, "catalogue", texts, "acme-")
    common = [f"artifact_root={root}", "model=acme"]

    # Publish: a committed version with the model's own tokenizer, made production.
    published = last_json(run_job("publish_model", *common, f"source={own_model}"))
    assert published["production"] == "base" and published["max_seq_length"] == MAX_SEQ_LENGTH
    version_dir = layout.model_version("acme", "base")
    assert (
        store.read_bytes(f"{version_dir}/tokenizer.json")
        == (own_model / "tokenizer.json").read_bytes()
    )
    registry = store.read_json(layout.registry("acme"))
    assert registry["history"][0]["verdict"] == "BASE"
    # A re-run finds it published; another source under the same name is refused.
    assert last_json(run_job("publish_model", *common, f"source={own_model}"))["version"] == "base"
    # The same model at another path is the same model; another one is refused.
    same = tmp_path / "same"
    shutil.copytree(own_model, same)
    assert last_json(run_job("publish_model", *common, f"source={same}"))["version"] == "base"
    other = _variant(
        own_model,
        tmp_path / "other",
        lambda d: _edit_json(d / "tokenizer_config.json", model_max_length=256),
    )
    again = run_job("publish_model", *common, f"source={other}")
    assert again.returncode == 2 and "already exists from another source" in again.stderr

    # Embed with the base version: sentence-transformers' vectors at its own 384 tokens.
    out_ids, ours = embed_and_read(root, "acme", "base", "catalogue")
    assert out_ids == ids
    report = store.read_json("runs/acme/manual/reports/embed-catalogue.json")
    assert report["max_length"] == MAX_SEQ_LENGTH and report["forward"] == "padded"
    assert report["truncated"] == int((tokens > MAX_SEQ_LENGTH).sum())
    cos = cosines(ours, st.encode(texts, batch_size=8))
    assert cos.min() >= MIN_COSINE, cos.min()

    # Its sentence-transformers export reproduces the job's vectors.
    last_json(run_job("export_st", *common, "version=base"))
    copy = local_copy(store, "acme", "base", tmp_path / "base-st")
    tok_cfg = json.loads((copy / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"  # as tokenizer.json says
    assert json.loads((copy / "config.json").read_text())["model_type"] == "distilbert"
    exported = SentenceTransformer(str(copy), device="cpu").encode(texts, batch_size=8)
    assert cosines(ours, exported).min() >= MIN_COSINE


def test_own_model_through_the_refresh_dag(
    own_model: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Published, then the refresh DAG under dag.test() with ``model=acme``: trained from
    it with its own tokenizer, evaluated, gated against it, the corpus embedded, verified,
    loaded into the index and search-checked, and all released together; the released
    version's export gives the DAG's vectors."""
    from sentence_transformers import SentenceTransformer

    from embedfresh.core.releases import live_release
    from embedfresh.jobs.export_st import local_copy
    from tests.test_dags import SOURCES, run_dag

    source = next(s for s in SOURCES if s.dag_id == "embedding_model_refresh" and s.file)
    root = f"file://{tmp_path / 'artifacts'}"  # the root run_dag gives a DAG file
    store = ArtifactStore(root)
    common = [f"artifact_root={root}", "model=acme"]
    # A random encoder: its own base learning rates, fine-tuned at a tenth of them.
    rates = ["encoder_learning_rate=0.01", "head_learning_rate=0.01"]
    last_json(run_job("publish_model", *common, f"source={own_model}", *rates))

    conf = {"model": "acme", "gate_metrics": ["recall_at_10", "accuracy"], "epochs": 2}
    run = run_dag(source, tmp_path, request, conf=conf)
    facts, run_id = run.facts, run.facts["run_id"]
    assert all(state == "success" for _, _, state in facts["tasks"]), run.output
    assert {t for t, _, _ in facts["tasks"]} >= {
        "train", "gate", "embed", "verify", "load_index", "search_check", "release",
    }  # fmt: skip
    assert facts["xcom"]["train"]["init"]["version"] == "base"
    gate = store.read_json(layout.report("acme", run_id, "gate"))
    assert gate["verdict"] == "PASS" and gate["reference"]["version"] == "base"
    # Against the published base, whose relevance head never trained: retrieval only.
    assert [m["metric"] for m in gate["metrics"]] == ["recall_at_10"]
    assert list(gate["metrics_not_compared"]) == ["accuracy"]
    assert store.read_json(layout.registry("acme"))["production"]["version"] == run_id
    assert (
        store.read_bytes(f"{layout.model_version('acme', run_id)}/tokenizer.json")
        == (own_model / "tokenizer.json").read_bytes()
    )

    out = layout.embeddings("acme", run_id, "products")
    # The live release is the run's: its version with exactly these embeddings.
    release = live_release(store, "acme")
    assert release is not None and (release.release, release.version) == (run_id, run_id)
    manifest = store.read_bytes(f"{out}/_MANIFEST.json")
    assert release.corpus("products").manifest_sha256 == hashlib.sha256(manifest).hexdigest()
    parts = sorted(n for n in store.listdir(out) if n.endswith(".parquet"))
    table = pa.concat_tables(read_parquet(store, f"{out}/{n}") for n in parts)
    ours = table.column("embedding").combine_chunks().flatten().to_numpy()
    ours = ours.reshape(table.num_rows, -1)
    corpus = layout.corpus("products")
    texts = (
        pa.concat_tables(
            read_parquet(store, f"{corpus}/{n}")
            for n in sorted(store.listdir(corpus))
            if n.endswith(".parquet")
        )
        .column("text")
        .to_pylist()
    )
    last_json(run_job("export_st", *common, f"version={run_id}"))
    copy = local_copy(store, "acme", run_id, tmp_path / "released-st")
    theirs = SentenceTransformer(str(copy), device="cpu").encode(texts, batch_size=32)
    assert cosines(ours, theirs).min() >= MIN_COSINE


@pytest.fixture(scope="module")
def own_mpnet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_own_model(tmp_path_factory.mktemp("own-mpnet") / "mpnet-st", "mpnet")


def test_int8_of_an_encoder_the_quantiser_cannot_handle_is_refused_before_any_write(
    own_mpnet: Path, tmp_path: Path
) -> None:
    """A team's own MPNet with quantize=int8: PyTorch's x86 quantiser fails on its graph
    (it observes MPNet's integer relative-position buckets), so the embed job exits 2
    with the modes that do run, before any write."""
    root = f"file://{tmp_path / 'store'}"
    store = ArtifactStore(root)
    sink = io.BytesIO()
    texts = [f"{t} {i}" for i, t in enumerate(CORPUS * 4)]
    pq.write_table(pa.table({"id": [f"sku-{i}" for i in range(len(texts))], "text": texts}), sink)
    store.write_bytes(f"{layout.corpus('catalogue')}/part-00000.parquet", sink.getvalue())
    common = [f"artifact_root={root}", "model=acme-mpnet"]
    last_json(run_job("publish_model", *common, f"source=file://{own_mpnet}", "version=v0"))
    done = run_job("embed", *common, "version=v0", "corpus=catalogue", "quantize=int8")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "cannot quantise this encoder" in done.stderr and "quantize=bf16" in done.stderr
    assert not store.exists(layout.embeddings("acme-mpnet", "v0", "catalogue"))


@pytest.mark.parametrize(
    ("model", "forward"),
    [("own_bert", "packed"), ("own_bert_cls", "padded"), ("own_mpnet", "padded")],
)
def test_own_bert_model_with_its_own_tokenizer_and_pooling(
    model: str, forward: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Mean pooling on the packed fast path; CLS pooling (BGE's) and MPNet (positions
    after the pad id, no sdpa in transformers) on the padded one."""
    from sentence_transformers import SentenceTransformer

    from embedfresh.jobs.export_st import local_copy

    own_bert = request.getfixturevalue(model)
    root = f"file://{tmp_path / 'store'}"
    store = ArtifactStore(root)
    st = SentenceTransformer(str(own_bert), device="cpu")
    texts = _texts(st)
    ids = list(range(10**12, 10**12 + len(texts)))  # int64 ids beyond 32 bits
    sink = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "text": texts}), sink)
    store.write_bytes(f"{layout.corpus('catalogue')}/part-00000.parquet", sink.getvalue())
    common = [f"artifact_root={root}", "model=acme-bert"]
    last_json(run_job("publish_model", *common, f"source=file://{own_bert}", "version=v0"))
    out_ids, ours = embed_and_read(root, "acme-bert", "v0", "catalogue")
    assert out_ids == ids
    report = store.read_json("runs/acme-bert/manual/reports/embed-catalogue.json")
    assert report["forward"] == forward and report["max_length"] == MAX_SEQ_LENGTH
    assert cosines(ours, st.encode(texts, batch_size=8)).min() >= MIN_COSINE
    last_json(run_job("export_st", *common, "version=v0"))
    copy = local_copy(store, "acme-bert", "v0", tmp_path / "v0-st")
    tok_cfg = json.loads((copy / "tokenizer_config.json").read_text())
    if model != "own_mpnet":  # BERT's tokenizer config: cased, as the model's own tokenizer
        assert tok_cfg["do_lower_case"] is False
    exported = SentenceTransformer(str(copy), device="cpu").encode(texts, batch_size=8)
    assert cosines(ours, exported).min() >= MIN_COSINE


def test_dense_module_and_prompts_as_sentence_transformers_has_them(tmp_path: Path) -> None:
    """A Dense module (48 -> 32, tanh) after pooling and query/document prompts: the
    corpus is embedded as ``encode_document`` does it, the export keeps both, and
    training and evaluation run with the query prompt."""
    from sentence_transformers import SentenceTransformer

    from embedfresh.jobs.export_st import local_copy
    from tests.conftest import write_data

    prompts = {"query": "query: ", "document": "passage: "}
    source = build_own_model(tmp_path / "dense-st", "bert", dense=32, prompts=prompts)
    root = f"file://{tmp_path / 'store'}"
    write_data(root)
    store = ArtifactStore(root)
    st = SentenceTransformer(str(source), device="cpu")
    common = [f"artifact_root={root}", "model=acme-dense"]
    last_json(run_job("publish_model", *common, f"source={source}"))
    texts = read_parquet(store, f"{layout.corpus('products')}/part-00000.parquet")
    texts = texts.column("text").to_pylist()
    _, ours = embed_and_read(root, "acme-dense", "base", "products")
    assert ours.shape == (len(texts), 32)
    report = store.read_json("runs/acme-dense/manual/reports/embed-products.json")
    assert report["forward"] == "padded"
    assert cosines(ours, st.encode_document(texts, batch_size=32)).min() >= MIN_COSINE
    # The prompt matters: without it the vectors differ (a negative control).
    assert cosines(ours, st.encode(texts, batch_size=32)).min() < 0.9999

    last_json(run_job("export_st", *common, "version=base"))
    copy = local_copy(store, "acme-dense", "base", tmp_path / "dense-export")
    exported = SentenceTransformer(str(copy), device="cpu")
    assert exported.prompts.get("document") == "passage: "
    assert cosines(ours, exported.encode_document(texts, batch_size=32)).min() >= MIN_COSINE

    run = [*common, "run_id=r1"]
    trained = run_job("train", *run, f"data_interval_start={DAY1}", "max_steps=3")
    assert last_json(trained)["steps"] == 3
    assert last_json(run_job("evaluate", *run))["metrics"]["recall_at_10"] > 0


def _variant(src: Path, dest: Path, edit) -> Path:
    shutil.copytree(src, dest)
    edit(dest)
    return dest


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: _edit_json(d / "config.json", auto_map={"AutoModel": "modeling.Mine"}),
            "needs trust_remote_code",
        ),
        (
            lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"),
            "save_pretrained('",
        ),
        (lambda d: (d / "tokenizer.json").unlink(), "has no tokenizer.json"),
        (
            lambda d: _edit_json(d / "config.json", model_type="gpt2"),
            "'gpt2' is a decoder or encoder-decoder model",
        ),
        (
            lambda d: _edit_json(d / "1_Pooling" / "config.json", pooling_mode="lasttoken"),
            "lasttoken pooling of the encoder 'bert' is not supported",
        ),
        (
            lambda d: _edit_json(
                d / "config_sentence_transformers.json",
                prompts={"query": "query: "},
                default_prompt_name="query",
            ),
            "default_prompt_name 'query' is not supported",
        ),
    ],
    ids=[
        "remote-code",
        "bin-only",
        "no-fast-tokenizer",
        "architecture",
        "lasttoken",
        "default-prompt",
    ],
)
def test_directories_this_project_would_embed_differently_are_refused(
    own_bert: Path, tmp_path: Path, edit, message: str
) -> None:
    source = _variant(own_bert, tmp_path / "variant", edit)
    root = f"file://{tmp_path / 'store'}"
    done = run_job("publish_model", f"artifact_root={root}", "model=acme", f"source={source}")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert not (tmp_path / "store").exists()  # validated before the first write


def test_an_unknown_model_names_the_command_that_publishes_it(root: str) -> None:
    done = run_job("train", f"artifact_root={root}", "model=acme", f"data_interval_start={DAY1}")
    assert done.returncode == 2
    assert "python -m embedfresh.jobs.publish_model" in done.stderr and "model=acme" in done.stderr
    preset = run_job("publish_model", f"artifact_root={root}", "model=tiny", f"source={root}")
    assert preset.returncode == 2 and "built-in preset" in preset.stderr


def test_own_model_from_s3_into_an_s3_store(own_bert: Path, s3_root: str) -> None:
    """The model directory and the store both on S3 (moto's server): published from
    ``s3://``, embedded (reuse keyed by the corpus shards' ETags), a re-run reuses all."""
    import boto3

    bucket = s3_root.removeprefix("s3://").split("/")[0]
    s3 = boto3.client("s3")
    for path in own_bert.rglob("*"):
        if path.is_file():
            key = f"incoming/acme-st/{path.relative_to(own_bert)}"
            s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    common = [f"artifact_root={s3_root}", "model=acme"]
    source = f"s3://{bucket}/incoming/acme-st"
    published = last_json(run_job("publish_model", *common, f"source={source}"))
    assert published["production"] == "base" and published["max_seq_length"] == MAX_SEQ_LENGTH
    sets = [*common, "version=base", "corpus=products"]
    first = last_json(run_job("embed", *sets))
    assert first["shards_skipped"] == [] and first["rows"] > 0
    last_json(run_job("embed_verify", *sets))
    again = last_json(run_job("embed", *sets))
    assert again["shards_done"] == [] and again["shards_skipped"] == first["shards_done"]


def test_generic_encoder_is_float32_whatever_its_config_was_saved_in() -> None:
    import torch

    from embedfresh.ml.model.hf_encoder import HFEncoder

    config = {
        "model_type": "distilbert",
        "vocab_size": 50,
        "dim": 16,
        "n_layers": 1,
        "n_heads": 2,
        "hidden_dim": 32,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }
    encoder = HFEncoder(config)
    assert {p.dtype for p in encoder.parameters()} == {torch.float32}
    ids = torch.tensor([[2, 5, 7, 3, 0]])
    out = encoder(ids, (ids != 0).long())
    assert out.dtype == torch.float32 and torch.allclose(out.norm(dim=1), torch.ones(1))


def test_export_names_the_special_tokens_of_a_unigram_tokenizer() -> None:
    """XLM-R-like: a Unigram vocabulary (a list of [piece, score]) with <s>, <pad> (id 1),
    </s>, <unk>, <mask>: the export must name those, not BERT's [PAD]/[UNK]."""
    from tokenizers import Tokenizer
    from tokenizers.models import Unigram
    from tokenizers.trainers import UnigramTrainer

    from embedfresh.jobs.export_st import tokenizer_settings
    from embedfresh.ml.model.presets import EncoderConfig, ModelSpec

    tok = Tokenizer(Unigram())
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok.train_from_iterator(
        CORPUS * 10, UnigramTrainer(vocab_size=200, special_tokens=specials, unk_token="<unk>")
    )
    assert tok.token_to_id("<pad>") == 1
    spec = ModelSpec(
        name="xlmr",
        encoder=EncoderConfig(
            vocab_size=200,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=514,
        ),
        base_weights="published",
        max_length=32,
        head_hidden=8,
        features=(("price", "log1p"), ("rating", "div5"), ("discount", "identity")),
        default_batch_size=4,
        encoder_learning_rate=1e-4,
        head_learning_rate=1e-3,
        architecture={
            "model_type": "xlm-roberta",
            "pad_token_id": 1,
            "max_position_embeddings": 514,
        },
    )
    assert spec.position_limit == 512  # positions start after the pad id
    special, lowercase = tokenizer_settings(tok.to_str().encode(), spec)
    assert special == {
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "cls_token": "<s>",
        "sep_token": "</s>",
        "mask_token": "<mask>",
    }
    assert lowercase is False


def test_publish_killed_before_promotion_is_finished_by_a_plain_rerun(
    own_bert: Path, tmp_path: Path
) -> None:
    """The state a kill between the version's COMMIT and the registry write leaves (a
    committed version, no production) is what ``production=false`` leaves: a plain
    re-run makes it production without writing the version again."""
    root = f"file://{tmp_path / 'store'}"
    store = ArtifactStore(root)
    common = [f"artifact_root={root}", "model=acme", f"source={own_bert}"]
    first = last_json(run_job("publish_model", *common, "production=false"))
    assert first["production"] is None and not store.exists(layout.registry("acme"))
    commit = Path(store.path(f"{layout.model_version('acme', 'base')}/COMMIT"))
    before = commit.stat().st_mtime_ns
    rerun = last_json(run_job("publish_model", *common))
    assert rerun["production"] == "base"
    assert commit.stat().st_mtime_ns == before  # the version was not written again
    history = store.read_json(layout.registry("acme"))["history"]
    assert [h["verdict"] for h in history] == ["BASE"]
