"""The ``xla`` backend (torch-xla, ``PJRT_DEVICE=CPU`` here) behind the same jobs:
train and evaluate run on it, nothing recompiles after warm-up, a SIGKILLed run resumes
bit-exactly, and checkpoints/model versions move between cpu and xla unchanged.

torch_xla is imported only in the job subprocesses: importing it starts a PJRT runtime.
Backend choice (``auto``) is tested through :func:`embedfresh.ml.backends.detect`'s inputs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from embedfresh.core.exit_codes import BadInputError
from embedfresh.ml.backends import detect, get_backend
from tests.conftest import ROOT, job_env, run_job
from tests.test_train_resume import train_until_killed, weights_sha

XLA_ENV = {"PJRT_DEVICE": "CPU"}
STEPS = 16  # of 32 per epoch: each xla process spends ~5 s starting and compiling
TRAIN = (
    "data_interval_start=2026-01-01",
    "epochs=1",
    f"max_steps={STEPS}",
    "checkpoint_every=5",
    "keep_last=2",
    "log_every=1",
    "init=base",
)
XLA_TRAIN = (*TRAIN, "backend=xla")
CPU_TRAIN = (*TRAIN, "backend=cpu")


def train(root: str, run_id: str, sets: tuple[str, ...]) -> dict:
    result = run_job("train", f"artifact_root={root}", f"run_id={run_id}", *sets, env=XLA_ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def report(root: str, run_id: str, name: str) -> dict:
    path = Path(root.removeprefix("file://")) / "runs/tiny" / run_id / "reports" / f"{name}.json"
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def root(data_template: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    dest = tmp_path_factory.mktemp("xla") / "artifacts"
    shutil.copytree(data_template, dest)
    return f"file://{dest}"


@pytest.fixture(scope="module")
def reference(root: str) -> str:
    """An uninterrupted xla run; its report and weights are what the others compare to."""
    summary = train(root, "xla-ref", XLA_TRAIN)
    assert summary["resumed_from"] is None and summary["steps"] == STEPS
    return weights_sha(root, "xla-ref")


def test_train_on_xla_reports_backend_and_no_recompiles(root, reference):
    rep = report(root, "xla-ref", "train")
    assert rep["backend"] == "xla"
    assert rep["device"].startswith("xla")
    assert rep["pjrt_device"] == "CPU"
    assert rep["compiles"] > 0, "the XLA CompileTime metric was not read"
    assert rep["compiles_after_warmup"] == 0
    assert rep["padding"] == "max_length"  # static shapes: one graph, not one per length
    assert [s for s, _ in rep["loss_curve"]] == list(range(1, STEPS + 1))


def test_evaluate_on_xla_matches_cpu(root, reference):
    for backend in ("xla", "cpu"):
        result = run_job(
            "evaluate",
            f"artifact_root={root}",
            f"run_id=ev-{backend}",
            "version=xla-ref",
            f"backend={backend}",
            env=XLA_ENV,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    on_xla, on_cpu = report(root, "ev-xla", "eval"), report(root, "ev-cpu", "eval")
    assert on_xla["backend"] == "xla" and on_cpu["backend"] == "cpu"
    for name, value in on_cpu["metrics"].items():
        assert on_xla["metrics"][name] == pytest.approx(value, abs=2e-3), name


def test_sigkill_then_resume_on_xla_is_bit_exact(root, reference):
    train_until_killed(root, "xla-killed", 8, sets=XLA_TRAIN, env=XLA_ENV)
    summary = train(root, "xla-killed", XLA_TRAIN)
    assert summary["resumed_from"]["step"] == 5
    assert summary["compiles_after_warmup"] == 0
    assert weights_sha(root, "xla-killed") == reference


@pytest.mark.parametrize(("first", "then"), [("cpu", "xla"), ("xla", "cpu")])
def test_checkpoint_written_on_one_backend_resumes_on_the_other(root, reference, first, then):
    run_id = f"{first}-to-{then}"
    sets = {"cpu": CPU_TRAIN, "xla": XLA_TRAIN}
    train_until_killed(root, run_id, 8, sets=sets[first], env=XLA_ENV)
    summary = train(root, run_id, sets[then])
    assert summary["resumed_from"]["step"] == 5
    rep = report(root, run_id, "train")
    assert rep["backend"] == then and rep["steps_this_attempt"] == STEPS - 5


LOAD_BACK = """
import json, sys
import torch
from embedfresh.ml.backends import get_backend
from embedfresh.ml.checkpoint import CheckpointManager, cpu_state_dict, to_cpu
from embedfresh.ml.model import versions
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.training import make_optimizer

root, version, run_id = sys.argv[1:]
store = ArtifactStore(root)
xla = get_backend("xla")
loaded = versions.load(store, "tiny", version)
model = versions.instantiate(loaded).to(xla.device)
back = cpu_state_dict(model)
assert back.keys() == loaded.weights.keys()
bad = [k for k, v in loaded.weights.items() if not torch.equal(v, back[k])]
assert not bad, bad

# The newest checkpoint of run_id (hash taken from its own meta): weights and optimizer
# state onto xla and back, unchanged.
meta_hash = versions.is_committed(store, "tiny", run_id)["config_hash"]
ckpt = CheckpointManager(store, "tiny", run_id, 2, meta_hash).load_latest()
model.load_state_dict(ckpt.weights)
opt = make_optimizer(model, type("C", (), {"incremental_lr_scale": 1.0, "learning_rate": 1e-3,
                                           "weight_decay": 0.01})(), incremental=False)
opt.load_state_dict(ckpt.state["optimizer"])
assert all(p.device.type == "xla" for s in opt.state.values() for p in s.values()
           if p.dim() > 0)
state_back = to_cpu(opt.state_dict())
ref = ckpt.state["optimizer"]["state"]
for i, s in ref.items():
    for k, v in s.items():
        assert torch.equal(v, state_back["state"][i][k]), (i, k)
back = cpu_state_dict(model)
assert all(torch.equal(v, back[k]) for k, v in ckpt.weights.items())
print(json.dumps({"ok": True, "tensors": len(back), "step": ckpt.step}))
"""


def test_weights_and_optimizer_state_load_onto_xla_unchanged(root, reference):
    """Versions and checkpoints written on cpu and on xla load on xla bit for bit."""
    for run_id in ("cpu-to-xla", "xla-to-cpu"):
        if not (Path(root.removeprefix("file://")) / "models/tiny/versions" / run_id).exists():
            train(root, run_id, CPU_TRAIN)  # when run alone
        result = subprocess.run(
            [sys.executable, "-c", LOAD_BACK, root, run_id, run_id],
            cwd=ROOT,
            env=job_env(XLA_ENV),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert json.loads(result.stdout.strip().splitlines()[-1])["ok"]


def test_auto_prefers_neuron_then_cuda_then_cpu(tmp_path):
    absent, present = tmp_path / "neuron0-absent", tmp_path / "neuron0"
    present.touch()
    yes, no = (lambda: True), (lambda: False)
    assert detect({}, present, yes) == "neuron"
    assert detect({"PJRT_DEVICE": "NEURON"}, absent, yes) == "neuron"
    assert detect({"PJRT_DEVICE": "CPU"}, absent, yes) == "cuda"
    assert detect({}, absent, yes) == "cuda"
    assert detect({}, absent, no) == "cpu"


def test_neuron_backend_refuses_another_pjrt_device(monkeypatch):
    """Checked before torch_xla is imported, so this runs without Neuron hardware."""
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    with pytest.raises(BadInputError, match="PJRT_DEVICE=NEURON"):
        get_backend("neuron")


def test_embed_on_xla_matches_cpu_with_one_compile_per_static_shape(
    root: str, reference: str, tmp_path: Path
) -> None:
    """The embed job on xla: the same ids and vectors as on cpu, graphs bounded by shapes."""
    import numpy as np
    import pyarrow.parquet as pq

    cpu_copy = tmp_path / "cpu"
    shutil.copytree(root.removeprefix("file://"), cpu_copy)
    vectors = {}
    for backend, store_root, env in (
        ("xla", root, XLA_ENV),
        ("cpu", f"file://{cpu_copy}", {}),
    ):
        sets = ("version=xla-ref", "corpus=products", f"backend={backend}", "run_id=emb")
        result = run_job("embed", f"artifact_root={store_root}", *sets, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        out = Path(store_root.removeprefix("file://")) / "embeddings/tiny/xla-ref/products"
        table = pq.read_table(sorted(out.glob("part-*.parquet")))
        vectors[backend] = dict(
            zip(table["id"].to_pylist(), np.array(table["embedding"].to_pylist()), strict=True)
        )
        if backend == "xla":
            emb = report(store_root, "emb", "embed-products")
    assert vectors["xla"].keys() == vectors["cpu"].keys()
    assert len(vectors["xla"]) == 600
    ids = sorted(vectors["xla"])
    a = np.stack([vectors["xla"][i] for i in ids])
    b = np.stack([vectors["cpu"][i] for i in ids])
    assert float(np.min(np.sum(a * b, axis=1))) >= 0.99999
    assert emb["backend"] == "xla" and emb["packed"] is False
    assert 0 < emb["compiles"] <= len(emb["shapes"]), emb
