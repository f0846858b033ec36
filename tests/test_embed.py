"""The embed job and its verifier: exact ids, bucketing that does not change vectors,
idempotent retries after a SIGKILL, and a specific outcome for each kind of bad corpus."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from embedfresh.core import cli, layout
from embedfresh.core.config import EmbedConfig
from embedfresh.core.parquet import read_parquet
from embedfresh.core.storage import ArtifactStore
from embedfresh.jobs.embed import embed
from embedfresh.jobs.embed_verify import verify
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.embedding import bucketing
from embedfresh.ml.embedding.bucketing import VariableTokenizer, make_batches, padded_lengths
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec
from embedfresh.ml.model.tokenizer import TextTokenizer
from tests.conftest import ROOT, job_env, run_job

OUT = "embeddings/tiny/v1/{corpus}"


def _publish(root: str) -> ArtifactStore:
    store = ArtifactStore(root)
    spec = get_spec("tiny")
    versions.publish(store, spec, "v1", cpu_state_dict(versions.build_model(spec, 0)), {})
    return store


def _corpus(store: ArtifactStore, name: str, shards: list[pa.Table]) -> None:
    for i, table in enumerate(shards):
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        store.write_bytes(
            f"{layout.corpus(name)}/{layout.part_name(i)}", sink.getvalue().to_pybytes()
        )


def _table(ids, texts, text_type: pa.DataType | None = None) -> pa.Table:
    text = pa.array(texts, text_type or pa.string())
    return pa.table({"id": pa.array(ids, pa.int64()), "text": text})


def _products(store: ArtifactStore) -> tuple[np.ndarray, list[str]]:
    tables = [read_parquet(store, f"corpora/products/{layout.part_name(i)}") for i in range(3)]
    t = pa.concat_tables(tables)
    return t.column("id").to_numpy(), t.column("text").to_pylist()


def _outputs(store: ArtifactStore, corpus: str) -> tuple[np.ndarray, np.ndarray]:
    out = OUT.format(corpus=corpus)
    names = sorted(n for n in store.listdir(out) if n.endswith(".parquet"))
    t = pa.concat_tables([read_parquet(store, f"{out}/{n}") for n in names])
    hidden = t.schema.field("embedding").type.list_size
    vectors = t.column("embedding").combine_chunks().flatten().to_numpy().reshape(-1, hidden)
    return t.column("id").to_numpy(), vectors


def _reference(store: ArtifactStore, texts: list[str]) -> np.ndarray:
    """Each text tokenised alone at the model's own length and embedded alone."""
    version = versions.load(store, "tiny", "v1")
    model = versions.instantiate(version).eval()
    tok = TextTokenizer(version.tokenizer_json, version.spec.embedding_max_length)
    out = []
    with torch.inference_mode():
        for text in texts:
            t = tok([text])
            out.append(
                model.embed(torch.from_numpy(t.input_ids), torch.from_numpy(t.attention_mask))
            )
    return torch.cat(out).numpy()


def _in_process(root: str, *sets: str, fn=embed) -> int:
    argv = []
    for s in (f"artifact_root={root}", "model=tiny", "version=v1", *sets):
        argv += ["--set", s]
    return cli.run_job("embed", EmbedConfig, fn, argv)


def _cfg(root: str, **kw) -> EmbedConfig:
    return EmbedConfig(artifact_root=root, model="tiny", version="v1", **kw)


def test_bucketing_static_shapes_and_order() -> None:
    assert padded_lengths([16, 32, 64, 128, 256], 32) == (16, 32)
    assert padded_lengths([16, 64], 40) == (16, 40)
    tokens = [[1] * n for n in (3, 20, 16, 17, 2, 32, 5)]
    plan = make_batches(tokens, (16, 32), token_budget=64, static=True)
    assert {b.input_ids.shape for b in plan.batches} == {(4, 16), (2, 32)}
    index = np.concatenate([b.index for b in plan.batches])
    assert sorted(index.tolist()) == list(range(len(tokens)))
    for b in plan.batches:
        for row, pos in enumerate(b.index):
            assert b.attention_mask[row].sum() == len(tokens[pos]) <= b.length
        assert b.attention_mask[b.real :].sum() == 0  # dummy rows
    assert plan.real_tokens == sum(map(len, tokens))
    assert plan.padded_tokens == sum(b.input_ids.size for b in plan.batches)


def test_token_ids_in_chunks_equal_the_tokenizers_own_and_batch_alike(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokenised in chunks into one int32 array: the same ids, truncations and batches as
    the tokenizer's own per-text lists, across chunk boundaries, for any text."""
    version = versions.load(_publish(root), "tiny", "v1")
    from tokenizers import Tokenizer

    reference = Tokenizer.from_str(version.tokenizer_json.decode())
    reference.no_padding()
    reference.enable_truncation(max_length=20)
    texts = [
        f"{i} " + ("boots waterproof, Größe 42 " * (i % 9)) + ("長靴 " if i % 3 else "ботинки ")
        for i in range(23)
    ] + ["", "x " * 500]
    expected = [e.ids for e in reference.encode_batch(texts)]
    monkeypatch.setattr(bucketing, "TOKENIZE_CHUNK", 4)  # 7 chunks, the last of 1 text
    ids, truncated = VariableTokenizer(version.tokenizer_json, 20)(texts)

    assert len(ids) == len(texts) and ids.flat.dtype == np.int32
    assert [t.tolist() for t in ids] == expected  # iteration
    assert [ids[i].tolist() for i in range(-len(texts), len(texts))] == expected * 2
    with pytest.raises(IndexError):
        ids[len(texts)]
    assert [t.tolist() for t in ids[3:9:2]] == expected[3:9:2]
    assert truncated == sum(1 for t in expected if len(t) == 20) > 1
    as_arrays = make_batches(ids, (8, 20), token_budget=64)
    as_lists = make_batches(expected, (8, 20), token_budget=64)
    assert len(as_arrays.batches) == len(as_lists.batches)
    for a, b in zip(as_arrays.batches, as_lists.batches, strict=True):
        assert np.array_equal(a.input_ids, b.input_ids) and np.array_equal(a.index, b.index)
    empty, none = VariableTokenizer(version.tokenizer_json, 20)([])
    assert len(empty) == 0 and none == 0 and make_batches(empty, (8, 20), 64).batches == []


def test_embed_matches_corpus_and_single_text_embedding(root: str) -> None:
    store = _publish(root)
    base = ("artifact_root=" + root, "model=tiny", "version=v1", "corpus=products")
    first = run_job("embed", *base, "shards=[0,1]")
    assert first.returncode == 0, first.stderr
    assert not store.exists(f"{OUT.format(corpus='products')}/_MANIFEST.json")
    second = run_job("embed", *base, "shards=[2]")
    assert second.returncode == 0, second.stderr
    rep01 = store.read_json("runs/tiny/manual/reports/embed-products-0-1.json")
    rep2 = store.read_json("runs/tiny/manual/reports/embed-products-2.json")
    assert rep01["shards_done"] == [0, 1] and rep2["shards_done"] == [2]
    assert rep01["rows"] + rep2["rows"] == 600
    assert 0 < rep01["padding_efficiency"] <= 1 and rep01["sentences_per_s"] > 0
    assert rep01["shapes"] == [[64, 64], [128, 32]]  # one static shape per used length

    ids, texts = _products(store)
    out_ids, vectors = _outputs(store, "products")
    np.testing.assert_array_equal(out_ids, ids)
    ref = _reference(store, texts)
    cos = (vectors * ref).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(vectors, axis=1)
    assert cos.min() >= 0.99999, cos.min()

    check = run_job("embed_verify", *base)
    assert check.returncode == 0, check.stderr
    out = Path(store.path(OUT.format(corpus="products")))
    manifest = json.loads((out / "_MANIFEST.json").read_text())
    assert manifest["rows"] == 600 and manifest["version"] == "v1"
    assert {k: v["rows"] for k, v in manifest["parts"].items()} == {
        layout.part_name(i): 200 for i in range(3)
    }
    assert manifest["throughput"]["sentences_per_s"] > 0
    newest_other = max(p.stat().st_mtime_ns for p in out.iterdir() if p.name != "_MANIFEST.json")
    assert (out / "_MANIFEST.json").stat().st_mtime_ns >= newest_other

    # All committed: a rerun skips everything and keeps the manifest.
    assert _in_process(root, "corpus=products") == 0
    rerun = store.read_json("runs/tiny/manual/reports/embed-products.json")
    assert rerun["shards_skipped"] == [0, 1, 2]
    assert store.exists(f"{OUT.format(corpus='products')}/_MANIFEST.json")


def test_buckets_of_mixed_lengths_do_not_change_vectors(root: str) -> None:
    store = _publish(root)
    words = "wireless noise cancelling headphones with long battery life and soft case".split()
    texts = [" ".join(words[: 1 + i % len(words)]) * (1 + i % 4) for i in range(150)]
    texts += ["", "a", "very " * 100]
    _corpus(store, "mixed", [_table(range(1000, 1000 + len(texts)), texts)])
    assert _in_process(root, "corpus=mixed", "token_budget=512") == 0
    report = store.read_json("runs/tiny/manual/reports/embed-mixed.json")
    assert report["shapes"] == [[8, 64], [16, 32], [32, 16]]
    out_ids, vectors = _outputs(store, "mixed")
    np.testing.assert_array_equal(out_ids, np.arange(1000, 1000 + len(texts)))
    ref = _reference(store, texts)
    assert ((vectors * ref).sum(1)).min() >= 0.99999
    assert verify(_cfg(root, corpus="mixed"))["rows"] == len(texts)


def test_killed_task_retry_redoes_only_uncommitted_shards(root: str) -> None:
    store = _publish(root)
    ids, texts = _products(store)
    big = 20  # shard 1 takes seconds, so the kill lands while it is being embedded
    _corpus(
        store,
        "killme",
        [
            _table(ids[:50], texts[:50]),
            _table(np.arange(10**6, 10**6 + big * 600), texts * big),
            _table(ids[50:100], texts[50:100]),
        ],
    )
    sets = [f"artifact_root={root}", "model=tiny", "version=v1", "corpus=killme"]
    cmd = [sys.executable, "-m", "embedfresh.jobs.embed"] + [a for s in sets for a in ("--set", s)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=job_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    try:
        for line in proc.stderr:
            if "shard 0 committed" in line:
                proc.send_signal(signal.SIGKILL)
                break
            assert time.monotonic() < deadline
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    out = OUT.format(corpus="killme")
    assert store.exists(f"{out}/part-00000.COMMIT")
    assert not store.exists(f"{out}/part-00001.COMMIT")
    # What a half-written upload would leave: the retry must overwrite it.
    store.write_bytes(f"{out}/part-00001.parquet", b"partial garbage")
    bad = run_job("embed_verify", *sets)
    assert bad.returncode == 2 and "part-00001.parquet: not committed" in bad.stderr

    retry = run_job("embed", *sets)
    assert retry.returncode == 0, retry.stderr
    report = store.read_json("runs/tiny/manual/reports/embed-killme.json")
    assert report["shards_skipped"] == [0] and report["shards_done"] == [1, 2]
    out_ids, vectors = _outputs(store, "killme")
    assert len(out_ids) == len(np.unique(out_ids)) == 100 + big * 600
    ok = run_job("embed_verify", *sets)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["rows"] == 100 + big * 600


@pytest.mark.parametrize(
    ("shards", "message"),
    [
        ([pa.table({"id": pa.array([1, 2], pa.int64()), "body": ["a", "b"]})], "missing columns"),
        ([_table([1, 2], [b"a", b"b"], pa.binary())], "text is binary, expected string"),
        ([pa.table({"id": [1.5], "text": ["a"]})], "id is double, expected int64 or string"),
        ([pa.table({"id": ["a", ""], "text": ["x", "y"]})], "empty string id (row 1)"),
        ([_table([], [])], "empty corpus shard"),
        ([_table([1, 2, 2], ["a", "b", "c"])], "1 duplicate ids"),
        (
            [_table([1, 2], ["a", "b"]), _table([3, 1], ["c", "d"])],
            "share 1 ids",
        ),
        ([_table([1, 2, 3], ["a", None, "c"])], "1 null texts (first at row 1)"),
        # A string column whose bytes are not UTF-8 (Parquet does not check).
        (
            [pa.table({"id": [1, 2], "text": pa.array([b"ok", b"\xff\xfe"]).view(pa.string())})],
            "not valid UTF-8",
        ),
    ],
    ids=[
        "schema",
        "binary",
        "id-type",
        "empty-string-id",
        "empty",
        "dup-in-shard",
        "dup-across",
        "null-text",
        "non-utf8",
    ],
)
def test_bad_corpus_exits_2_naming_the_shard(
    root: str, shards: list[pa.Table], message: str, capsys: pytest.CaptureFixture
) -> None:
    store = _publish(root)
    _corpus(store, "bad", shards)
    assert _in_process(root, "corpus=bad") == 2
    err = capsys.readouterr().err
    assert message in err and "corpora/bad/part-0000" in err, err


def test_a_bad_last_shard_is_refused_before_any_shard_is_written(
    root: str, capsys: pytest.CaptureFixture
) -> None:
    """Every shard the task embeds is read and validated (texts, ids, ids across shards)
    before the model loads: a bad shard at the end leaves no part and no marker behind."""
    store = _publish(root)
    good = [
        _table(list(range(i * 10, i * 10 + 10)), [f"t{j}" for j in range(10)]) for i in range(3)
    ]
    for name, last in (
        ("late-null", _table([90, 91], ["a", None])),
        ("late-dup", _table([95, 5], ["a", "b"])),  # id 5 is in shard 0
    ):
        _corpus(store, name, [*good, last])
        assert _in_process(root, f"corpus={name}") == 2
        err = capsys.readouterr().err
        assert "part-00003" in err, err  # the null's shard; the repeat names both
        out = OUT.format(corpus=name)
        assert not store.exists(out) or store.listdir(out) == [], store.listdir(out)


def test_texts_over_max_length_are_truncated_and_counted(root: str) -> None:
    # tiny's own length is its 64 position embeddings: [CLS] + 63 tokens + [SEP] is cut.
    store = _publish(root)
    texts = ["lorem ipsum dolor " * 400, "short text", "x " * 63, "x " * 62]
    _corpus(store, "long", [_table([1, 2, 3, 4], texts)])
    assert _in_process(root, "corpus=long") == 0
    report = store.read_json("runs/tiny/manual/reports/embed-long.json")
    assert report["truncated"] == 2 and report["rows"] == 4
    assert report["max_length"] == 64 and report["truncated_per_shard"] == {"0": 2}
    assert report["truncated_reused"] == 0
    assert verify(_cfg(root, corpus="long"))["rows"] == 4

    # A re-run reuses the shard and embeds nothing, but its report still says that the
    # output it stands for holds two cut texts (from the shard's commit marker).
    assert _in_process(root, "corpus=long", "run_id=again") == 0
    again = store.read_json("runs/tiny/again/reports/embed-long.json")
    assert again["shards_skipped"] == [0] and again["truncated"] == 0
    assert again["truncated_reused"] == 2 and again["rows_reused"] == 4


def test_verify_refuses_gaps_and_bad_vectors(root: str, capsys: pytest.CaptureFixture) -> None:
    store = _publish(root)
    assert _in_process(root, "corpus=products", "shards=[0,2]") == 0
    assert _in_process(root, "corpus=products", fn=verify) == 2
    assert "part-00001.parquet: not committed" in capsys.readouterr().err
    assert not store.exists(f"{OUT.format(corpus='products')}/_MANIFEST.json")
    # A NaN vector in a committed part (re-committed so the checksum matches).
    from embedfresh.core import markers
    from embedfresh.core.shards import commit_name
    from embedfresh.jobs.embed import shard_bytes

    out = OUT.format(corpus="products")
    t = read_parquet(store, f"{out}/part-00002.parquet")
    vectors = t.column("embedding").combine_chunks().flatten().to_numpy().reshape(t.num_rows, -1)
    vectors = vectors.copy()
    vectors[3] = np.nan
    data = shard_bytes(t.column("id").to_numpy(), vectors, "v1")
    store.write_bytes(f"{out}/part-00002.parquet", data)
    meta = store.read_json(f"{out}/{commit_name(2)}")
    meta.pop("files")
    markers.write_marker(store, out, {"part-00002.parquet": data}, meta, name=commit_name(2))
    assert _in_process(root, "corpus=products", "shards=[1]") == 0
    assert _in_process(root, "corpus=products", fn=verify) == 2
    assert "part-00002.parquet: 1 vectors with NaN/inf" in capsys.readouterr().err


def test_verify_finds_ids_repeated_across_tasks(root: str, capsys: pytest.CaptureFixture) -> None:
    store = _publish(root)
    _corpus(store, "dupx", [_table([1, 2], ["a", "b"]), _table([3, 2], ["c", "d"])])
    # Two mapped tasks each see one shard, so only the verifier can catch the repeat.
    assert _in_process(root, "corpus=dupx", "shards=[0]") == 0
    assert _in_process(root, "corpus=dupx", "shards=[1]") == 0
    assert _in_process(root, "corpus=dupx", fn=verify) == 2
    assert "1 ids appear in more than one corpus shard" in capsys.readouterr().err
    assert not store.exists(f"{OUT.format(corpus='dupx')}/_MANIFEST.json")


# --- what a release carries never changes -------------------------------------------


def _release_products(store: ArtifactStore, release: str) -> None:
    """Make ``release`` live with tiny v1 and its verified products embeddings, as the
    release job records them (no vector index needed: only the store is read here)."""
    from embedfresh.core.embedding_sets import read_embedding_set
    from embedfresh.core.index import live_view_name, table_name
    from embedfresh.core.registry import PROMOTE, Registry
    from embedfresh.core.releases import CorpusRelease, release_doc, write_release

    eset = read_embedding_set(store, "tiny", "v1", "products")
    corpus = CorpusRelease(
        corpus="products",
        manifest=eset.manifest_url,
        manifest_sha256=eset.manifest_sha256,
        rows=eset.rows,
        hidden=eset.hidden,
        settings=eset.settings,
        index={
            "kind": "pgvector",
            "location": "embedded:test",
            "table": table_name("tiny", release, "products"),
            "live_view": live_view_name("tiny", "products"),
        },
        search_check={"verdict": "PASS"},
    )
    made, written = write_release(
        store,
        release_doc(
            model="tiny",
            release=release,
            version="v1",
            version_url=store.url(layout.model_version("tiny", "v1")),
            run_id=release,
            action=PROMOTE,
            corpora={"products": corpus},
            created_at="2026-01-02T00:00:00+00:00",
        ),
    )
    assert written
    Registry(store, "tiny").release(made, details={"run_id": release, "verdict": "PASS"})


def _files(store: ArtifactStore) -> dict[str, bytes]:
    """Every file in the store, by its path in the store."""
    base = Path(store.path(""))
    return {str(p.relative_to(base)): p.read_bytes() for p in base.rglob("*") if p.is_file()}


def test_a_set_a_kept_release_carries_is_never_rewritten(
    root: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shard 1 of the corpus changed after release rel-jan carried tiny v1's products
    embeddings: a re-run would rewrite part 1 under the release, so it exits 2 naming the
    release and writes nothing. Once retention no longer keeps that release, the same
    re-run embeds the changed shard (so it is the release that refuses it)."""
    from embedfresh.core.settings import KEEP_RELEASES_ENV
    from tests.releasing import bare_release

    monkeypatch.delenv(KEEP_RELEASES_ENV, raising=False)  # the default: 3 kept
    store = _publish(root)
    assert _in_process(root, "corpus=products") == 0
    assert _in_process(root, "corpus=products", fn=verify) == 0
    _release_products(store, "rel-jan")
    capsys.readouterr()

    shard = f"{layout.corpus('products')}/{layout.part_name(1)}"
    table = read_parquet(store, shard)
    texts = table.column("text").to_pylist()
    texts[5] = "a text that changed after the release"
    sink = pa.BufferOutputStream()
    pq.write_table(_table(table.column("id").to_pylist(), texts), sink)
    store.write_bytes(shard, sink.getvalue().to_pybytes())

    before = _files(store)
    assert _in_process(root, "corpus=products", "run_id=again") == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "carried by release(s) rel-jan" in last, err
    assert "shard 1: the corpus shard changed" in last, err
    assert _files(store) == before  # no part, marker, manifest, report or record

    # The set is no longer kept once two later releases went live with keep=2.
    bare_release(store, "tiny", "v1", "rel-feb")
    assert _in_process(root, "corpus=products", "run_id=again") == 2  # still kept (of 3)
    bare_release(store, "tiny", "v1", "rel-mar")
    monkeypatch.setenv(KEEP_RELEASES_ENV, "2")
    assert _in_process(root, "corpus=products", "run_id=again") == 0, capsys.readouterr().err
    report = store.read_json(layout.report("tiny", "again", "embed-products"))
    assert report["shards_done"] == [1] and report["shards_skipped"] == [0, 2]
    part = f"{OUT.format(corpus='products')}/{layout.part_name(1)}"
    assert store.read_bytes(part) != before[part]


def test_verifying_the_same_set_again_keeps_the_manifest_byte_for_byte(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release names the manifest by its sha256: a second verify of the same parts
    (a day later, by another run) keeps it; a set that changed gets a new one."""
    import datetime as dt
    from types import SimpleNamespace

    from embedfresh.jobs import embed_verify

    store = _publish(root)
    manifest = f"{OUT.format(corpus='products')}/_MANIFEST.json"
    assert _in_process(root, "corpus=products") == 0
    first = verify(_cfg(root, corpus="products"))
    written = store.read_bytes(manifest)

    class _DayLater(dt.datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[override]
            return dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=tz)

    monkeypatch.setattr(embed_verify, "dt", SimpleNamespace(datetime=_DayLater, UTC=dt.UTC))
    again = verify(_cfg(root, corpus="products", run_id="again"))
    assert store.read_bytes(manifest) == written
    assert again["rows"] == first["rows"] == 600

    # Negative control: other parts (embedded at another length) get a new manifest,
    # written at the (patched) time of this verify.
    assert _in_process(root, "corpus=products", "max_length=32", "run_id=short") == 0
    verify(_cfg(root, corpus="products", run_id="short", max_length=32))
    rewritten = store.read_bytes(manifest)
    assert rewritten != written
    assert json.loads(rewritten)["created_at"] == "2030-01-02T03:04:05+00:00"
