"""The quality gate job end to end on real models and real eval splits: the identical
model passes, a candidate degraded by about 1% accuracy fails on a large eval split and is
INCONCLUSIVE (with a sample-size request) on 200 examples, the report and its plot hold
what the web UI shows, the first run is gated against the baseline, and missing or empty
eval data is a clear bad-input error.

Eval splits: the conftest data set (768 rows) for the identical-model and baseline cases;
``large`` (10,000 rows) for the degraded candidate, where a ~1% accuracy drop is decided
(at 768 rows a 1% drop is ~5 examples out of a few dozen disagreements: INCONCLUSIVE);
``small``, the first 200 rows of ``large``.
"""

from __future__ import annotations

import os
import shutil
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedfresh.core import layout, quality_chart
from embedfresh.core.config import EvaluateConfig, GateConfig, ReleaseConfig, TrainConfig
from embedfresh.core.exit_codes import BadInputError, ExitCode, GateRefusedError
from embedfresh.core.registry import Registry
from embedfresh.core.releases import live_release, read_release
from embedfresh.core.storage import ArtifactStore
from embedfresh.jobs.evaluate import evaluate
from embedfresh.jobs.gate import run_gate
from embedfresh.jobs.release import release
from embedfresh.ml.checkpoint import cpu_state_dict
from embedfresh.ml.data.generate import write_dataset
from embedfresh.ml.data.schema import demo_pair_schema
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec
from tests.conftest import DAY1, run_job

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = pytest.mark.slow

MODEL = "tiny"
LARGE_ROWS = 10_000
SMALL_ROWS = 200
TOLERANCE = 0.001
ALL_METRICS = ["accuracy", "auc", "log_loss", "ndcg_at_10"]
# The degraded candidate: accuracy on the large split this much (relatively) worse.
DROP_RANGE = (0.008, 0.015)
NOISE_SCALES = (0.3, 0.5, 0.8, 1.2)
NOISE_SEEDS = range(24)


@dataclass(frozen=True)
class World:
    root: str
    store: ArtifactStore
    noise: dict  # how the degraded candidate was made and what it does to accuracy


def gate_report(store: ArtifactStore, run_id: str) -> dict:
    return store.read_json(layout.report(MODEL, run_id, "gate"))


def eval_report(store: ArtifactStore, run_id: str, name: str = "eval") -> dict:
    return store.read_json(layout.report(MODEL, run_id, name))


def registry_bytes(store: ArtifactStore) -> bytes | None:
    rel = layout.registry(MODEL)
    return store.read_bytes(rel) if store.exists(rel) else None


def metric(report: dict, name: str) -> dict:
    (m,) = [m for m in report["metrics"] if m["metric"] == name]
    return m


def accuracy_of(store: ArtifactStore, report: dict) -> float:
    """Accuracy recomputed from the per-example outcomes the evaluate job wrote."""
    rel = report["outcomes"]["examples"].removeprefix(store.url("")).lstrip("/")
    with store.open_read(rel) as f:
        t = pq.read_table(f)
    label, prob = t.column("label").to_numpy(), t.column("prob").to_numpy()
    return float(((prob >= 0.5) == (label == 1)).mean())


def check_svg(store: ArtifactStore, report: dict) -> ET.Element:
    """The plot exists, is the page's chart (vl-convert's SVG of the decision's Vega-Lite
    spec): the tolerance line at -0.1%, one interval per metric, the verdict in its title."""
    rel = report["plot"].removeprefix(store.url("")).lstrip("/")
    svg = ET.fromstring(store.read_bytes(rel))
    ns = "{http://www.w3.org/2000/svg}"
    assert svg.tag == f"{ns}svg"

    def marks(name: str) -> list[ET.Element]:
        (group,) = [
            g for g in svg.iter(f"{ns}g") if f"role-mark {name}_marks" in (g.get("class") or "")
        ]
        return list(group)

    assert marks("sla_line"), "no SLA line"
    labels = [quality_chart.label(m["metric"]) for m in report["metrics"]]
    for name in ("interval", "point"):  # one mark per metric, named by it
        found = [e.get("aria-label", "").split(";")[0] for e in marks(name)]
        assert found == [f"metric: {label}" for label in labels], (name, found)
    texts = [t.text or "" for t in svg.iter(f"{ns}text")]
    assert "\u22120.1%" in texts and "+0.1%" in texts, texts  # vl-convert's minus sign
    assert f"Gate {report['verdict']}: {report['mode'].replace('_', ' ')}" in texts, texts
    return svg


def check_common(report: dict, n_examples: int, metrics=ALL_METRICS) -> None:
    assert report["mode"] == "no_regression"
    assert report["tolerance"] == TOLERANCE
    assert report["n_examples"] == n_examples
    assert [m["metric"] for m in report["metrics"]] == list(metrics)
    for m in report["metrics"]:
        assert m["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE")
        assert m["ci_low"] <= m["d"] <= m["ci_high"], m
        expected_n = report["n_queries"] if m["metric"] == "ndcg_at_10" else n_examples
        assert m["n"] == expected_n, m
        assert m["d"] == pytest.approx((m["m_cand"] - m["m_ref"]) / m["m_ref"])


# --- set-up -------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """In-process jobs on a small shared box: one intra-op thread (see conftest.job_env)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _perturbed_head(version, x: np.ndarray, p0: np.ndarray, labels: np.ndarray):
    """Search seeded Gaussian noise on the relevance head for a ~1% accuracy drop.

    Noise on the head (scaled by each tensor's std) moves the decision with fewer
    disagreements per point of accuracy than noise on the encoder, and only the head has
    to be re-run per try: ``x`` is its input, captured once. Qualifies: a relative drop in
    DROP_RANGE on the whole split, and, on the first SMALL_ROWS rows, disagreements with
    the reference in both directions (as almost every 200-row slice has at this drop).
    """
    import torch

    model = versions.instantiate(version).eval()
    # Sorted: safetensors hands the tensors back in no fixed order, and the noise drawn
    # for each tensor must not depend on it.
    keys = sorted(k for k, v in version.weights.items() if k.startswith("head.") and v.numel() > 1)
    acc0 = ((p0 >= 0.5) == (labels == 1)).mean()
    tried = []
    for scale in NOISE_SCALES:
        for seed in NOISE_SEEDS:
            g = torch.Generator().manual_seed(seed)
            weights = dict(version.weights)
            for k in keys:
                w = weights[k]
                weights[k] = w + scale * w.float().std() * torch.randn(w.shape, generator=g)
            model.load_state_dict(weights)
            with torch.inference_mode():
                p = torch.sigmoid(model.head(torch.from_numpy(x)).squeeze(-1)).double().numpy()
            correct0, correct = (p0 >= 0.5) == (labels == 1), (p >= 0.5) == (labels == 1)
            drop = float((acc0 - correct.mean()) / acc0)
            worse = int((correct0 & ~correct)[:SMALL_ROWS].sum())
            better = int((~correct0 & correct)[:SMALL_ROWS].sum())
            tried.append((scale, seed, round(drop, 5), worse, better))
            if DROP_RANGE[0] <= drop <= DROP_RANGE[1] and worse and better:
                info = {"scale": scale, "seed": seed, "search_drop": drop}
                info |= {"flips": int((correct0 != correct).sum()), "tried": tried}
                return weights, info
    pytest.fail(f"no noise in the search grid degrades accuracy by {DROP_RANGE}: {tried}")


def _degrade(store: ArtifactStore) -> dict:
    """Publish ``degraded``: the trained candidate with seeded noise on its relevance head."""
    import torch

    from embedfresh.ml.backends import get_backend
    from embedfresh.ml.data.reader import read_eval
    from embedfresh.ml.inference import score
    from embedfresh.ml.model.tokenizer import TextTokenizer

    version = versions.load(store, MODEL, "cand")
    model = versions.instantiate(version)
    examples = read_eval(store, "large", version.spec.features)
    tokenizer = TextTokenizer(version.tokenizer_json, version.spec.max_length)
    captured: list[torch.Tensor] = []
    hook = model.head.register_forward_hook(lambda m, args, out: captured.append(args[0]))
    try:
        p0 = score(
            model,
            get_backend("cpu"),
            tokenizer(examples.queries),
            tokenizer(examples.products),
            examples.features,
            64,
        )
    finally:
        hook.remove()
    x = torch.cat(captured).numpy()[: len(examples)]  # the last batch is padded
    weights, info = _perturbed_head(version, x, p0, examples.labels.astype(np.int64))
    meta = {"degraded_from": "cand", "noise_scale": info["scale"], "noise_seed": info["seed"]}
    versions.publish(store, version.spec, "degraded", weights, meta)
    return info


@pytest.fixture(scope="module")
def world(data_template: Path, tmp_path_factory: pytest.TempPathFactory) -> World:
    dest = tmp_path_factory.mktemp("gate") / "artifacts"
    shutil.copytree(data_template, dest)
    root = f"file://{dest}"
    store = ArtifactStore(root)
    write_dataset(store, "large", 0, DAY1, 1, 32, LARGE_ROWS, "large", 10, 10)
    with store.open_read(f"{layout.eval_split('large')}/part-00000.parquet") as f:
        head = pq.read_table(f).slice(0, SMALL_ROWS)
    buf = pa.BufferOutputStream()
    pq.write_table(head, buf)
    store.write_bytes(
        f"{layout.eval_split('small')}/part-00000.parquet", buf.getvalue().to_pybytes()
    )
    for name in store.listdir(layout.judgments("large")):  # the same judged queries
        rel = f"{layout.judgments('large')}/{name}"
        store.write_bytes(f"{layout.judgments('small')}/{name}", store.read_bytes(rel))

    # Three epochs at the tiny config's default learning rate (1e-3) leave the relevance
    # head predicting the majority class (every probability < 0.5: accuracy = share of
    # negatives), where no small change moves accuracy; 3e-3 gives a real classifier.
    train(
        TrainConfig(
            artifact_root=root,
            run_id="cand",
            data_interval_start=DAY1,
            epochs=3,
            init="base",
            learning_rate=3e-3,
            log_every=1000,
        )
    )
    evaluate(EvaluateConfig(artifact_root=root, run_id="cand"))
    return World(root, store, _degrade(store))


def train(cfg: TrainConfig) -> dict:
    from embedfresh.jobs.train import train as train_job

    return train_job(cfg)


@pytest.fixture(scope="module")
def identical(world: World) -> dict:
    """The trained candidate gated against itself (reference pinned to its own version)."""
    summary = run_gate(
        GateConfig(artifact_root=world.root, run_id="cand", reference="cand", metrics=ALL_METRICS)
    )
    return summary


@pytest.fixture(scope="module")
def production(world: World, identical: dict) -> str:
    """The candidate, released after its PASS (without corpora): production for the
    refresh runs below."""
    release(ReleaseConfig(artifact_root=world.root, run_id="cand", corpora=[]))
    assert Registry(world.store, MODEL).production_version() == "cand"
    assert live_release(world.root, MODEL).release == "cand"
    return "cand"


@pytest.fixture(scope="module")
def degraded_eval(world: World) -> dict:
    evaluate(
        EvaluateConfig(artifact_root=world.root, run_id="degraded", dataset="large")
    )  # version defaults to the run id: the published ``degraded``
    return eval_report(world.store, "degraded")


# --- the identical model ------------------------------------------------------------------


def test_identical_model_passes(world: World, identical: dict):
    assert identical["verdict"] == "PASS"
    assert identical["reference"] == "cand"
    report = gate_report(world.store, "cand")
    assert report["verdict"] == "PASS"
    assert report["reference"] == {
        "version": "cand",
        "source": "pinned",
        "metrics": eval_report(world.store, "cand")["metrics"],
    }
    assert report["candidate"]["version"] == "cand"
    check_common(report, n_examples=768)
    for m in report["metrics"]:
        assert m["verdict"] == "PASS"
        assert m["d"] == 0.0 and m["ci_low"] == 0.0 and m["ci_high"] == 0.0
    assert report["n_needed"] is None
    check_svg(world.store, report)
    # The reference was really evaluated (under the run, as eval-reference), not copied.
    ref_eval = eval_report(world.store, "cand", "eval-reference")
    assert ref_eval["version"] == "cand" and ref_eval["dataset"] == "products"
    assert ref_eval["metrics"] == eval_report(world.store, "cand")["metrics"]


# --- a candidate degraded by about 1% -----------------------------------------------------


def test_degraded_candidate_fails_and_production_stays(
    world: World, production: str, degraded_eval: dict
):
    store = world.store
    before = registry_bytes(store)
    assert before is not None

    with pytest.raises(GateRefusedError, match=r"^FAIL: accuracy: ") as exc:
        run_gate(
            GateConfig(
                artifact_root=world.root, run_id="degraded", dataset="large", metrics=ALL_METRICS
            )
        )
    assert exc.value.exit_code == ExitCode.GATE_REFUSED
    assert "vs production cand" in str(exc.value)

    report = gate_report(store, "degraded")
    assert report["verdict"] == "FAIL"
    assert report["reference"]["version"] == "cand"
    assert report["reference"]["source"] == "production"
    assert report["production_at_decision"] == "cand"
    check_common(report, n_examples=LARGE_ROWS)
    check_svg(store, report)

    # Accuracy alone decides it: ~1% worse, interval entirely below -0.1%.
    acc = metric(report, "accuracy")
    acc_ref = accuracy_of(store, eval_report(store, "degraded", "eval-reference"))
    acc_cand = accuracy_of(store, degraded_eval)
    drop = (acc_ref - acc_cand) / acc_ref
    assert 0.005 <= drop <= 0.02, (drop, world.noise)
    assert acc["d"] == pytest.approx(-drop, abs=1e-9)
    assert acc["verdict"] == "FAIL"
    assert acc["ci_high"] < -TOLERANCE
    assert acc["n"] == LARGE_ROWS
    print(
        f"\nnoise search (scale, seed, drop, worse/better in the first 200): {world.noise['tried']}"
    )
    print(
        f"degraded candidate (noise {world.noise['scale']} x std, seed "
        f"{world.noise['seed']}, {world.noise['flips']} predictions flipped of {LARGE_ROWS}): "
        f"accuracy {acc_ref:.4f} -> {acc_cand:.4f}, d = {acc['d']:+.4%} "
        f"[{acc['ci_low']:+.4%}, {acc['ci_high']:+.4%}]; other metrics: "
        + ", ".join(
            f"{m['metric']} {m['verdict']} d={m['d']:+.3%}"
            for m in report["metrics"]
            if m["metric"] != "accuracy"
        )
    )

    # Production untouched by the gate, and the release job refuses the run.
    assert registry_bytes(store) == before
    with pytest.raises(GateRefusedError, match="gate verdict is FAIL"):
        release(ReleaseConfig(artifact_root=world.root, run_id="degraded", corpora=[]))
    assert registry_bytes(store) == before
    assert not store.exists(layout.release(MODEL, "degraded"))
    assert Registry(store, MODEL).production_version() == "cand"


def test_same_degradation_on_200_examples_is_inconclusive(
    world: World, production: str, degraded_eval: dict
):
    store = world.store
    before = registry_bytes(store)
    run = "degraded-200"
    evaluate(
        EvaluateConfig(artifact_root=world.root, run_id=run, dataset="small", version="degraded")
    )
    cfg = GateConfig(
        artifact_root=world.root,
        run_id=run,
        version="degraded",
        dataset="small",
        metrics=["accuracy"],
    )
    with pytest.raises(GateRefusedError, match=r"^INCONCLUSIVE: ") as exc:
        run_gate(cfg)
    message = str(exc.value)
    assert exc.value.exit_code == ExitCode.GATE_REFUSED

    report = gate_report(store, run)
    assert report["verdict"] == "INCONCLUSIVE"
    check_common(report, n_examples=SMALL_ROWS, metrics=["accuracy"])
    check_svg(store, report)
    acc = metric(report, "accuracy")
    assert acc["verdict"] == "INCONCLUSIVE"
    assert acc["ci_low"] < -TOLERANCE <= acc["ci_high"]
    assert report["n_needed"] > SMALL_ROWS and acc["n_needed"] == report["n_needed"]
    assert not report["n_needed_capped"]
    assert f"(now {SMALL_ROWS})" in message
    assert f"about {report['n_needed']:,} examples" in message
    print(f"\n200 examples: {acc['reason']}")

    # Through the command line: the same decision, exit code 3.
    result = run_job(
        "gate",
        f"artifact_root={world.root}",
        f"run_id={run}",
        "version=degraded",
        "dataset=small",
        'metrics=["accuracy"]',
    )
    assert result.returncode == 3, result.stderr[-2000:]
    assert "gate: error: INCONCLUSIVE" in result.stderr
    assert f"(now {SMALL_ROWS})" in result.stderr

    assert registry_bytes(store) == before
    with pytest.raises(GateRefusedError, match="gate verdict is INCONCLUSIVE"):
        release(ReleaseConfig(artifact_root=world.root, run_id=run, version="degraded", corpora=[]))
    assert registry_bytes(store) == before


def test_regating_a_run_on_another_eval_set_re_evaluates_the_reference(world: World):
    """The reference report cached in a run is reused only for the same version *and* the
    same data set; a candidate evaluated on another data set than the gate's is refused."""
    root, run = world.root, "regate"
    evaluate(EvaluateConfig(artifact_root=root, run_id=run, version="cand"))
    run_gate(GateConfig(artifact_root=root, run_id=run, version="cand", reference="cand"))
    assert gate_report(world.store, run)["n_examples"] == 768

    evaluate(EvaluateConfig(artifact_root=root, run_id=run, version="cand", dataset="small"))
    with pytest.raises(BadInputError, match="evaluate the candidate on 'products' first"):
        run_gate(GateConfig(artifact_root=root, run_id=run, version="cand", reference="cand"))
    cfg = GateConfig(artifact_root=root, run_id=run, version="cand", reference="cand")
    summary = run_gate(cfg.model_copy(update={"dataset": "small"}))
    assert summary["verdict"] == "PASS"
    assert gate_report(world.store, run)["n_examples"] == SMALL_ROWS
    assert eval_report(world.store, run, "eval-reference")["dataset"] == "small"


# --- the first run: no production yet ------------------------------------------------------


@pytest.fixture
def root(data_template: Path, tmp_path: Path) -> str:
    dest = tmp_path / "artifacts"
    shutil.copytree(data_template, dest)
    return f"file://{dest}"


def publish_base_weights(store: ArtifactStore, name: str, seed: int = 0) -> None:
    spec = get_spec(MODEL)
    versions.publish(store, spec, name, cpu_state_dict(versions.build_model(spec, seed)), {})


def test_first_run_is_gated_against_the_baseline(root: str):
    store = ArtifactStore(root)
    # A candidate that *is* the base weights (tiny: random init with the gate's seed 0):
    # if the baseline is what job.py documents, every d is exactly 0.
    publish_base_weights(store, "first")
    evaluate(EvaluateConfig(artifact_root=root, run_id="first"))
    summary = run_gate(GateConfig(artifact_root=root, run_id="first", metrics=ALL_METRICS))
    assert summary["verdict"] == "PASS" and summary["reference"] == "baseline"

    report = gate_report(store, "first")
    assert report["reference"]["source"] == "baseline"
    assert report["reference"]["version"] == "baseline"
    assert report["production_at_decision"] is None
    # The baseline's relevance head is a seeded random init: the gate compares only
    # nDCG@10, and says why the head's metrics were left out.
    check_common(report, n_examples=768, metrics=("ndcg_at_10",))
    assert set(report["metrics_not_compared"]) == {"accuracy", "auc", "log_loss"}
    assert all("seeded random" in why for why in report["metrics_not_compared"].values())
    assert summary["metrics_not_compared"] == report["metrics_not_compared"]
    assert all(m["d"] == 0.0 for m in report["metrics"])
    marker = versions.is_committed(store, MODEL, "baseline")
    assert marker is not None
    assert versions.load(store, MODEL, "baseline").meta["baseline"] is True

    release(ReleaseConfig(artifact_root=root, run_id="first", corpora=[]))
    doc, _ = Registry(store, MODEL).read()
    assert doc["production"]["version"] == "first"
    assert doc["production"]["release"] == "first"
    assert doc["history"][-1]["previous"] is None
    assert read_release(store, MODEL, "first").doc["gate"]["reference"] == "baseline"

    # The next run is gated against production, not the baseline: a version a run
    # published (as train does), so every metric of the config is compared.
    publish_base_weights(store, "second")
    evaluate(EvaluateConfig(artifact_root=root, run_id="second"))
    run_gate(GateConfig(artifact_root=root, run_id="second", metrics=ALL_METRICS))
    report = gate_report(store, "second")
    assert report["reference"]["source"] == "production"
    assert report["reference"]["version"] == "first"
    assert report["production_at_decision"] == "first"
    check_common(report, n_examples=768)
    assert report["metrics_not_compared"] == {}


def test_a_gate_on_head_metrics_alone_against_an_untrained_head_is_refused(root: str):
    """Against the baseline, a gate of accuracy and AUC would PASS on a random head: it
    exits 2 before any write (no baseline published, no reference evaluated), naming the
    fix; a version published from a model directory is refused the same way."""
    store = ArtifactStore(root)
    publish_base_weights(store, "head")
    evaluate(EvaluateConfig(artifact_root=root, run_id="head"))
    files = Path(root.removeprefix("file://"))
    before = sorted(files.rglob("*"))
    with pytest.raises(BadInputError, match=r"metrics=\[.*ndcg_at_10") as exc:
        run_gate(GateConfig(artifact_root=root, run_id="head", metrics=["accuracy", "auc"]))
    assert "never trained" in str(exc.value) and exc.value.exit_code == ExitCode.BAD_INPUT
    assert versions.is_committed(store, MODEL, "baseline") is None
    assert sorted(files.rglob("*")) == before

    spec = get_spec(MODEL)
    weights = cpu_state_dict(versions.build_model(spec, 0))
    versions.publish(store, spec, "from-dir", weights, {"base": True, "source": "/models/x"})
    with pytest.raises(BadInputError, match="published from /models/x by publish_model"):
        run_gate(
            GateConfig(artifact_root=root, run_id="head", reference="from-dir", metrics=["auc"])
        )


# --- missing or empty eval data ------------------------------------------------------------


def test_missing_eval_report_is_bad_input(root: str):
    store = ArtifactStore(root)
    publish_base_weights(store, "m")
    with pytest.raises(BadInputError, match="no eval report for version m in run m") as exc:
        run_gate(GateConfig(artifact_root=root, run_id="m", reference="m"))
    assert exc.value.exit_code == ExitCode.BAD_INPUT
    assert not store.exists(layout.report(MODEL, "m", "gate"))

    # An eval report of another version in the run is not the candidate's.
    evaluate(EvaluateConfig(artifact_root=root, run_id="m", version="m"))
    with pytest.raises(BadInputError, match="no eval report for version other in run m"):
        run_gate(GateConfig(artifact_root=root, run_id="m", version="other", reference="m"))

    # The report exists but the per-example outcomes it names are gone.
    report = eval_report(store, "m")
    rel = report["outcomes"]["examples"].removeprefix(store.url("")).lstrip("/")
    store.remove(rel)
    with pytest.raises(BadInputError, match="eval outcomes .* missing or unreadable"):
        run_gate(GateConfig(artifact_root=root, run_id="m", reference="m"))
    assert registry_bytes(store) is None


def test_zero_eval_rows_is_bad_input(root: str):
    store = ArtifactStore(root)
    publish_base_weights(store, "z")

    # An eval split without rows: the evaluate job refuses it.
    empty = demo_pair_schema().empty_table()
    buf = pa.BufferOutputStream()
    pq.write_table(empty, buf)
    store.write_bytes(
        f"{layout.eval_split('empty')}/part-00000.parquet", buf.getvalue().to_pybytes()
    )
    with pytest.raises(BadInputError, match="empty eval split"):
        evaluate(EvaluateConfig(artifact_root=root, run_id="z", dataset="empty"))

    # Candidate outcomes without rows (a truncated eval): the gate refuses them.
    evaluate(EvaluateConfig(artifact_root=root, run_id="z"))
    report = eval_report(store, "z")
    for key in ("examples", "queries"):
        rel = report["outcomes"][key].removeprefix(store.url("")).lstrip("/")
        with store.open_read(rel) as f:
            table = pq.read_table(f)
        buf = pa.BufferOutputStream()
        pq.write_table(table.slice(0, 0), buf)
        store.write_bytes(rel, buf.getvalue().to_pybytes())
    with pytest.raises(BadInputError, match="candidate outcomes have no rows") as exc:
        run_gate(GateConfig(artifact_root=root, run_id="z", reference="z"))
    assert exc.value.exit_code == ExitCode.BAD_INPUT
    assert not store.exists(layout.report(MODEL, "z", "gate"))


# --- looks: an evaluation that grows while undecided -------------------------------------


def test_an_undecided_gate_evaluates_more_queries_and_looks_again(world: World):
    """A candidate two steps of training away from its reference, evaluated on 25 judged
    queries first: too few to decide, so the gate evaluates both sides on more (50, 100,
    ... up to max_queries) and looks again at each look's own confidence. What it decides
    on is what a direct evaluation of that many queries gives, side by side."""
    root, store = world.root, world.store
    train(
        TrainConfig(
            artifact_root=root, run_id="nudge", data_interval_start=DAY1, init_version="cand",
            max_steps=2, log_every=1000,
        )
    )  # fmt: skip
    evaluate(EvaluateConfig(artifact_root=root, run_id="nudge", queries=25))
    summary = run_gate(
        GateConfig(artifact_root=root, run_id="nudge", reference="cand", max_queries=400)
    )
    report = gate_report(store, "nudge")
    looks = report["looks"]
    sizes = [look["n_queries"] for look in looks]
    assert sizes == [25, 50, 100, 200, 400][: len(sizes)] and len(sizes) > 1, looks
    assert all(look["verdict"] == "INCONCLUSIVE" for look in looks[:-1]), looks
    assert looks[-1]["verdict"] == report["verdict"] == summary["verdict"]
    assert report["n_queries"] == summary["n_queries"] == sizes[-1]
    assert report["sequential"].startswith("group-sequential")
    # Each look at its planned confidence, spending at most 2.5% a tail in all.
    assert sum((1 - look["confidence"]) / 2 for look in looks) <= 0.025 + 1e-12
    # The grown evaluation is the evaluation of that many queries.
    m = metric(report, "ndcg_at_10")
    assert m["n"] == sizes[-1]
    for run, version, value in (
        ("direct-c", "nudge", m["m_cand"]),
        ("direct-r", "cand", m["m_ref"]),
    ):
        direct = evaluate(
            EvaluateConfig(artifact_root=root, run_id=run, version=version, queries=sizes[-1])
        )
        assert direct["metrics"]["ndcg_at_10"] == pytest.approx(value, abs=1e-6)
    print("looks:", [(look["n_queries"], look["verdict"]) for look in looks])
