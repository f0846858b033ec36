"""``quantize=int8``: the embed job publishes int8 embeddings only after the parity gate
(recall@10 on the eval split, int8 vs fp32) passes; otherwise exit 3 and nothing committed."""

from __future__ import annotations

import numpy as np
import pytest

from embedfresh.core import cli, layout
from embedfresh.core.config import EmbedConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.jobs.embed import embed
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.embedding import int8 as int8_mod
from embedfresh.ml.gate.decision import GateResult, Mode, Verdict
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec

OUT = layout.embeddings("tiny", "v1", "products")
REPORT = "runs/tiny/manual/reports/embed.json"


def _publish(root: str) -> ArtifactStore:
    store = ArtifactStore(root)
    spec = get_spec("tiny")
    versions.publish(store, spec, "v1", cpu_state_dict(versions.build_model(spec, 0)), {})
    return store


def _run(root: str, *sets: str) -> int:
    argv = []
    for s in (f"artifact_root={root}", "model=tiny", "version=v1", "quantize=int8", *sets):
        argv += ["--set", s]
    return cli.run_job("embed", EmbedConfig, embed, argv)


def _assert_nothing_committed(store: ArtifactStore) -> None:
    assert not [n for n in store.listdir(OUT) if n.endswith((".COMMIT", ".parquet", ".json"))]


def _check_matches_verdict(store: ArtifactStore, rc: int, err: str) -> dict:
    report = store.read_json(REPORT)
    parity = report["parity"]
    assert parity["metric"] == "recall_at_10" and parity["gate"]["mode"] == "parity"
    assert parity["gate"]["tolerance"] == 0.001 and parity["n_queries"] > 0
    if parity["verdict"] == "PASS":
        assert rc == 0 and report["status"] == "ok" and report["quantize"] == "int8"
        assert sorted(n for n in store.listdir(OUT) if n.endswith(".COMMIT")) == [
            f"part-0000{i}.COMMIT" for i in range(3)
        ]
        for i in range(3):
            assert store.read_json(f"{OUT}/part-0000{i}.COMMIT")["quantize"] == "int8"
    else:
        assert rc == 3, err
        assert "refused by the parity gate" in err and parity["verdict"] in err
        assert report["status"] == "refused" and report["shards_done"] == []
        _assert_nothing_committed(store)
    return parity


def test_int8_embed_obeys_its_parity_verdict(root: str, capsys: pytest.CaptureFixture) -> None:
    store = _publish(root)
    rc = _run(root)
    parity = _check_matches_verdict(store, rc, capsys.readouterr().err)
    print("tiny int8 parity:", parity["verdict"], parity["recall_at_10_int8"])


@pytest.mark.parametrize("verdict", [Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE])
def test_each_verdict_is_obeyed(
    root: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, verdict: Verdict
) -> None:
    """Whatever the real gate says about tiny, every verdict's path is exercised."""
    real_gate = int8_mod.gate

    def forced(*args, **kwargs) -> GateResult:
        result = real_gate(*args, **kwargs)
        fields = {**result.__dict__, "verdict": verdict, "reason": f"forced {verdict}"}
        return GateResult(**fields)

    monkeypatch.setattr(int8_mod, "gate", forced)
    store = _publish(root)
    rc = _run(root, "shards=[0,1,2]")
    report_path = REPORT.replace("embed.json", "embed-0-2.json")
    err = capsys.readouterr().err
    report = store.read_json(report_path)
    assert report["parity"]["verdict"] == verdict
    if verdict is Verdict.PASS:
        assert rc == 0 and report["shards_done"] == [0, 1, 2]
        out = store.read_json(f"{OUT}/part-00000.COMMIT")
        assert out["quantize"] == "int8"
    else:
        assert rc == 3 and f"forced {verdict}" in err
        _assert_nothing_committed(store)


def test_int8_vectors_stay_close_to_fp32(root: str) -> None:
    from embedfresh.ml.backends import get_backend
    from embedfresh.ml.embedding.bucketing import VariableTokenizer
    from embedfresh.ml.embedding.encode import embed_texts

    store = _publish(root)
    version = versions.load(store, "tiny", "v1")
    model = versions.instantiate(version).eval()
    backend = get_backend("cpu")
    q = int8_mod.quantize_int8(model, backend)
    tok = VariableTokenizer(version.tokenizer_json, 32)
    texts = ["wireless headphones", "usb-c cable 2m", "Das ist ein schöner Tag", "x " * 50]
    a = embed_texts(model, backend, tok, texts, (16, 32), 512, 64)
    b = embed_texts(q, backend, tok, texts, (16, 32), 512, 64)
    assert ((a * b).sum(1)).min() > 0.9
    assert not np.array_equal(a, b)  # quantisation did happen


def test_int8_refuses_non_cpu_backends() -> None:
    class FakeBackend:
        name = "cuda"

        class device:  # noqa: N801 - mimics torch.device
            type = "cuda"

    with pytest.raises(BadInputError, match="CPU backend only"):
        int8_mod.quantize_int8(None, FakeBackend())  # type: ignore[arg-type]


def test_int8_config_is_validated() -> None:
    with pytest.raises(Exception, match="quantize"):
        EmbedConfig(version="v1", quantize="int4")
    assert EmbedConfig(version="v1").quantize == "none"
    assert Mode.PARITY == "parity"
