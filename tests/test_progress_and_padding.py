"""Long work's progress lines (every 30 s or 5%, with rate and ETA) and the padding trim
that lets eager batches run at their own longest text: same vectors as at max_length,
for a BERT encoder (our graph) and an MPNet one (transformers' modules, positions offset
by the pad id), on right- and left-padded batches."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from embedfresh.core.progress import Progress
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.model.tokenizer import PAD_MULTIPLE, TextTokenizer, trim_padding
from tests.conftest import run_job
from tests.own_model import CORPUS, build_own_model

LINE = re.compile(
    r"(?P<what>.+): (?P<done>\d+) of (?P<total>\d+) (?P<unit>\w+)(?: \((?P<pct>[\d.]+)%\))?, "
    r"(?P<rate>[\d.e+-]+) \w+/s, elapsed (?P<elapsed>\S+), ETA (?P<eta>\S+)"
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture) -> list[re.Match]:
    return [LINE.fullmatch(r.getMessage()) for r in caplog.records]


def _progress(stderr: str) -> list[re.Match]:
    """The progress lines of a job's log ("<time> INFO <logger>: <message>")."""
    messages = (line.split(": ", 1)[-1] for line in stderr.splitlines() if " INFO " in line)
    return [m for m in map(LINE.fullmatch, messages) if m]


def test_progress_logs_every_5_percent_or_30_seconds_with_rate_and_eta(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = logging.getLogger("test.progress")
    caplog.set_level(logging.INFO, logger="test.progress")
    progress = Progress("evaluating m v1", 1000, log=log, clock=clock)
    for _ in range(100):  # 1% a call, 1 s each: a line every 5 calls (5%), none by time
        clock.now += 1.0
        progress.advance(10)
    lines = _lines(caplog)
    assert all(lines) and len(lines) == 20
    first = lines[0]
    assert first["what"] == "evaluating m v1" and first["done"] == "50" and first["pct"] == "5.0"
    assert float(first["rate"]) == 10.0  # 50 rows in 5 s
    assert first["elapsed"] == "0m05s" and first["eta"] == "1m35s"  # 950 rows at 10/s

    caplog.clear()
    slow = Progress("training m", 10_000, unit="steps", log=log, clock=clock)
    clock.now += 29.0
    slow.advance(1)
    assert not caplog.records  # under 30 s and under 5%
    clock.now += 1.5
    slow.advance(1)  # 30.5 s since the last line: one now, though only 0.02% is done
    (line,) = _lines(caplog)
    assert line["done"] == "2" and line["unit"] == "steps" and line["elapsed"] == "0m30s"
    assert float(line["rate"]) == pytest.approx(2 / 30.5, rel=1e-2)  # 0.0656: not "0"
    assert line["eta"] == "42h21m10s"  # 9,998 steps left at 2 per 30.5 s
    assert slow.finish() == pytest.approx(30.5)
    assert len(caplog.records) == 1  # its last line was the one just logged
    clock.now += 1.0
    slow.advance(1)
    slow.finish()
    assert len(caplog.records) == 2 and _lines(caplog)[-1]["done"] == "3"


@pytest.mark.parametrize(
    ("lengths", "side", "width"),
    [
        ([3, 9, 5], "right", 16),  # longest 9 -> 16 (a multiple of 8)
        ([3, 9, 5], "left", 16),
        ([8, 2], "right", 8),
        ([30, 30], "right", 32),  # never wider than the batch
        ([32, 1], "left", 32),
    ],
)
def test_trim_keeps_every_attended_column(lengths: list[int], side: str, width: int) -> None:
    full = 32
    mask = np.zeros((len(lengths), full), dtype=np.int64)
    for row, n in enumerate(lengths):
        if side == "right":
            mask[row, :n] = 1
        else:
            mask[row, full - n :] = 1
    ids = np.where(mask == 1, np.arange(1, full + 1), 0)
    t_ids, t_mask = trim_padding(ids, mask)
    assert t_ids.shape == (len(lengths), width) and width % PAD_MULTIPLE == 0
    assert t_mask.sum() == mask.sum() and t_ids.sum() == ids.sum()  # nothing attended cut
    if side == "left":  # the last tokens stay last
        assert (t_mask[:, -1] == 1).all()
    else:
        assert (t_mask[:, 0] == 1).all()


@pytest.fixture(scope="module", params=["bert", "mpnet"])
def own_encoder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    from embedfresh.ml.model.relevance import RelevanceModel
    from embedfresh.ml.model.sources import read_source
    from embedfresh.ml.model.versions import source_weights, spec_from_source

    directory = build_own_model(tmp_path_factory.mktemp(request.param) / "st", request.param)
    source = read_source(str(directory))
    spec = spec_from_source(
        source, "own", max_length=source.max_seq_length, head_hidden=8, default_batch_size=4,
        encoder_learning_rate=1e-5, head_learning_rate=1e-3,
    )  # fmt: skip
    model = RelevanceModel(spec)
    model.load_state_dict(source_weights(source, spec, 0))
    return model.eval(), TextTokenizer(source.tokenizer_json, source.max_seq_length)


def test_trimmed_batches_embed_as_the_full_width_does(own_encoder) -> None:
    model, tokenizer = own_encoder
    texts = [CORPUS[0][:12], CORPUS[6], CORPUS[1] + " " + CORPUS[7]]
    tokens = tokenizer(texts)
    ids, mask = tokens.input_ids, tokens.attention_mask
    assert ids.shape[1] == 384 and mask.sum(1).max() < 128
    with torch.inference_mode():
        full = model.embed(torch.from_numpy(ids), torch.from_numpy(mask))
        t_ids, t_mask = trim_padding(ids, mask)
        trimmed = model.embed(torch.from_numpy(t_ids), torch.from_numpy(t_mask))
    assert t_ids.shape[1] < 128
    cos = torch.nn.functional.cosine_similarity(full, trimmed)
    assert (cos >= 0.99999).all(), cos


def test_padding_line_says_how_batches_are_padded(tmp_path: Path) -> None:
    from embedfresh.ml.backends import get_backend
    from embedfresh.ml.training.data import TrainingSet
    from embedfresh.ml.training.run import padding_line

    backend = get_backend("cpu")
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    data = TrainingSet(mask, mask, mask, mask, torch.zeros(2, 1), torch.zeros(2))
    line = padding_line(backend, data, 4)
    assert "longest query and product" in line and "queries 1.5 tokens" in line
    backend.compiled = True
    assert "padded to max_length 4 (static shapes: torch.compile)" in padding_line(backend, data, 4)


def test_train_and_evaluate_say_their_progress_and_padding(root: str) -> None:
    """The jobs as a task runs them: progress lines with rate and ETA, how batches are
    padded and the peak memory in the report."""
    done = run_job(
        "train", f"artifact_root={root}", "run_id=told", "data_interval_start=2026-01-01",
        "max_steps=3",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [m for m in _progress(done.stderr) if m["what"] == "training tiny"]
    assert [m["done"] for m in steps] == ["1", "2", "3"], done.stderr  # each a third: > 5%
    assert "batches padded to their longest query and product" in done.stderr
    assert "freed activations go back to the system" in done.stderr
    report = ArtifactStore(root).read_json("runs/tiny/told/reports/train.json")
    assert report["padding"] == "longest" and report["peak_rss_mib"] > 100

    done = run_job("evaluate", f"artifact_root={root}", "run_id=told")
    assert done.returncode == 0, done.stderr[-3000:]
    evals = _progress(done.stderr)
    evaluated = ArtifactStore(root).read_json("runs/tiny/told/reports/eval.json")
    # The head's pairs, the corpus's documents, the judged queries: every text counted.
    search = evaluated["search"]
    rows = evaluated["n_examples"] + search["documents_ranked"] + evaluated["n_queries"]
    assert evals and evals[-1]["what"] == "evaluating tiny told", done.stderr
    assert int(evals[-1]["done"]) == int(evals[-1]["total"]) == rows
