"""SIGTERM during training (AWS Batch, a Spot reclaim, Airflow's on_kill): the job
finishes the step in progress, commits a checkpoint of exactly that step when the grace
period allows, logs the step and the checkpoint's URL and exits 75; the retry (same run
id) resumes from that step and ends bit-identical to an uninterrupted run.

Three layers, cheapest first: the handler and the decision alone; the train job in
this process (the checkpoint the stop writes, a second SIGTERM during its write, no
time left for it, a SIGTERM on an interval step and during the last step); then real
processes: one run SIGTERMed off the checkpoint interval, its retry and the
uninterrupted reference, and a data-parallel run (torchrun, gloo) where only rank 1 is
signalled and both ranks stop at the same step.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch

from embedfresh.core import layout, markers
from embedfresh.core.config import TrainConfig
from embedfresh.core.exit_codes import BadInputError, TransientError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.checkpoint import STATE, CheckpointManager
from embedfresh.ml.training import preemption
from embedfresh.ml.training.preemption import GRACE_ENV, Preemption, Stop, grace_seconds
from tests.conftest import DAY1, ROOT, job_env, run_job
from tests.reliability import figures
from tests.reliability.test_sigkill_resume import attempt
from tests.test_train_resume import TRAIN, weights_sha

CHECKPOINT_EVERY = 7  # as in TRAIN
STEPS = 64  # 1024 rows / batch 32 x 2 epochs
SIGTERM_AFTER = 10  # logged step after which the signal is sent: off the interval

_STEP = re.compile(r" step (\d+)/(\d+) ")
_STOPPED = re.compile(
    r"SIGTERM: stopped after step (\d+)/(\d+); checkpoint step (\d+) committed at (\S+); "
    r"([\d.]+) s since the signal"
)

# -- the handler and the decision ---------------------------------------------------------


def _wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.001)


def test_grace_period_default_setting_and_refusal():
    assert grace_seconds({}) == preemption.DEFAULT_GRACE_S == 30.0
    assert grace_seconds({GRACE_ENV: " 12.5 "}) == 12.5
    assert grace_seconds({GRACE_ENV: "0"}) == 0.0
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(BadInputError, match=GRACE_ENV):
            grace_seconds({GRACE_ENV: bad})


def test_sigterm_is_noted_not_fatal_repeats_counted_and_the_old_handler_restored():
    before = signal.getsignal(signal.SIGTERM)
    with Preemption(30.0) as p:
        assert p.installed and not p.requested
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for(lambda: p.signals == 1)
        first = p.received_at
        assert p.requested and first is not None
        os.kill(os.getpid(), signal.SIGTERM)  # a second one: counted, the time kept
        _wait_for(lambda: p.signals == 2)
        assert p.signals == 2 and p.received_at == first
    assert signal.getsignal(signal.SIGTERM) is before


def test_no_handler_off_the_main_thread():
    before = signal.getsignal(signal.SIGTERM)
    result = {}

    def other() -> None:
        p = Preemption(30.0)
        result["installed"] = p.install()
        p.uninstall()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert result == {"installed": False}
    assert signal.getsignal(signal.SIGTERM) is before


def test_decision_and_the_grace_budget():
    now = [100.0]
    p = Preemption(30.0, clock=lambda: now[0])
    assert p.decide() is None  # no signal: go on
    p.request()
    now[0] += 5.0
    assert p.decide() == Stop(waited=5.0, slowest_write=0.0, grace=30.0, signals=1)
    assert p.decide().checkpoint  # no write measured yet: tried
    p.wrote_checkpoint(12.0)
    p.wrote_checkpoint(3.0)  # the slowest one counts
    assert p.decide().slowest_write == 12.0
    assert p.decide().checkpoint  # 5 + 2 x 12 <= 30
    now[0] += 2.0
    assert not p.decide().checkpoint  # 7 + 2 x 12 > 30: exit 75 at once instead


def test_every_rank_decides_the_same_from_the_gathered_views():
    """Rank 1 alone got the signal; rank 0 alone measured a write: both stop, alike."""
    now = [0.0]
    ranks = [Preemption(20.0, clock=lambda: now[0]), Preemption(99.0, clock=lambda: now[0])]
    ranks[1].request()
    ranks[0].wrote_checkpoint(4.0)
    now[0] = 3.0
    views = [(None, 4.0, 20.0, 0), (3.0, 0.0, 99.0, 1)]  # what each rank contributes
    for rank, p in enumerate(ranks):
        seen = []

        def gather(mine, seen=seen, rank=rank):
            assert mine == views[rank]
            seen.append(mine)
            return views

        stop = p.decide(gather)
        assert seen, "decide must gather on every rank"
        assert stop == Stop(waited=3.0, slowest_write=4.0, grace=20.0, signals=1)
    none = [(None, 0.0, 30.0, 0), (None, 0.0, 30.0, 0)]
    assert Preemption(30.0).decide(lambda mine: none) is None


def test_forced_checkpoint_is_committed_loaded_and_purged_like_any_other(tmp_path):
    store = ArtifactStore(f"file://{tmp_path}")
    mgr = CheckpointManager(store, "tiny", "r", keep_last=2, config_hash="h", every=7)
    weights = {"w": torch.arange(4.0)}

    def save(step: int, **kw) -> str | None:
        return mgr.save(step, weights, {"step_seen": step}, {}, **kw)

    assert save(7) and save(10) is None  # 10 is off the interval
    assert save(10, force=True) == store.url(layout.checkpoint("tiny", "r", 10))
    assert save(64, last_step=True, force=True) is None  # the last step is the version
    assert mgr.committed_steps() == [7, 10]
    assert mgr.load().step == 10 and mgr.load().state["step_seen"] == 10
    assert save(14) and save(21)
    assert mgr.committed_steps() == [14, 21]  # keep_last=2: 10 went like any other


# -- the train job in this process --------------------------------------------------------


@pytest.fixture(scope="module")
def store_root(data_template: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    dest = tmp_path_factory.mktemp("preemption-inproc") / "artifacts"
    shutil.copytree(data_template, dest)
    return f"file://{dest}"


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _handled() -> bool:
    """Whether SIGTERM has a Python handler: without one it would end pytest itself."""
    return signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)


class _SigtermAt(logging.Handler):
    """Sends this process SIGTERM when the train job logs step ``at`` (once), only if
    the loop's handler is installed (:func:`_handled`)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.sent, self.unprotected = at, False, False

    def emit(self, record: logging.LogRecord) -> None:
        if self.sent or not record.getMessage().startswith(f"step {self.at}/"):
            return
        if not _handled():
            self.unprotected = True
            return
        self.sent = True
        os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class InProcess:
    error: BaseException | None
    summary: dict | None
    messages: list[str]
    committed: list[int]


def train_in_process(root: str, run_id: str, at: int, caplog, steps: int = 12) -> InProcess:
    """The train job in this process, SIGTERMed when it logs step ``at``."""
    from embedfresh.jobs.train import train

    cfg = TrainConfig(
        artifact_root=root,
        run_id=run_id,
        data_interval_start=DAY1,
        max_steps=steps,
        checkpoint_every=CHECKPOINT_EVERY,
        keep_last=2,
        log_every=1,
        init="base",
    )
    logger = logging.getLogger("embedfresh.jobs.train")
    trigger = _SigtermAt(at)
    logger.addHandler(trigger)
    caplog.clear()
    caplog.set_level(logging.INFO, logger="embedfresh.jobs.train")
    before = signal.getsignal(signal.SIGTERM)
    error, summary = None, None
    try:
        summary = train(cfg)
    except TransientError as e:
        error = e
    finally:
        logger.removeHandler(trigger)
    assert not trigger.unprotected, "SIGTERM had no handler while the loop ran"
    assert trigger.sent
    assert signal.getsignal(signal.SIGTERM) is before, "the loop left its handler behind"
    mgr = CheckpointManager(ArtifactStore(root), "tiny", run_id, 2, "unused")
    messages = [r.getMessage() for r in caplog.records]
    return InProcess(error, summary, messages, mgr.committed_steps())


def test_a_second_sigterm_during_the_checkpoint_write_is_ignored(store_root, caplog, monkeypatch):
    original = markers.publish
    calls = []

    def publish_under_a_second_sigterm(store, directory, *args, **kwargs):
        calls.append(directory)
        if _handled():  # lands while the checkpoint is being written
            os.kill(os.getpid(), signal.SIGTERM)
        return original(store, directory, *args, **kwargs)

    monkeypatch.setattr(markers, "publish", publish_under_a_second_sigterm)
    run = train_in_process(store_root, "twice", 3, caplog)
    assert isinstance(run.error, TransientError)
    assert "stopped by SIGTERM after step 3/12; checkpoint step 3 committed at" in str(run.error)
    assert calls == [layout.checkpoint("tiny", "twice", 3)]
    assert run.committed == [3]
    check = markers.verify(ArtifactStore(store_root), layout.checkpoint("tiny", "twice", 3))
    assert check.ok, check.reason
    [line] = [m for m in run.messages if m.startswith("SIGTERM: stopped")]
    assert "checkpoint step 3 committed at file://" in line and "SIGTERMs received here: 2" in line
    assert not any(m.startswith("step 4/") for m in run.messages)  # no step after it


def test_no_time_left_in_the_grace_period_exits_75_without_a_checkpoint(
    store_root, caplog, monkeypatch
):
    monkeypatch.setenv(GRACE_ENV, "0")
    run = train_in_process(store_root, "no-grace", 8, caplog)
    assert isinstance(run.error, TransientError)
    assert "after step 8/12 without a checkpoint" in str(run.error)
    assert run.committed == [7]  # the retry resumes from the interval checkpoint


def test_sigterm_on_an_interval_step_writes_no_second_checkpoint(store_root, caplog):
    run = train_in_process(store_root, "on-interval", 7, caplog)
    assert isinstance(run.error, TransientError)
    assert "checkpoint step 7 committed at" in str(run.error)
    assert run.committed == [7]
    written = [m for m in run.messages if m.startswith("checkpoint step 7 committed")]
    assert len(written) == 1


def test_sigterm_during_the_last_step_lets_the_run_finish(store_root, caplog):
    run = train_in_process(store_root, "last", 12, caplog)
    assert run.error is None and run.summary["status"] == "ok"
    assert run.summary["steps"] == 12 and run.committed == [7]
    assert any(m.startswith("SIGTERM during the last step (12/12)") for m in run.messages)


# -- real processes -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(data_template: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    dest = tmp_path_factory.mktemp("preemption") / "artifacts"
    shutil.copytree(data_template, dest)
    return f"file://{dest}"


@pytest.fixture(scope="module")
def reference(root: str) -> str:
    result = run_job("train", f"artifact_root={root}", "run_id=uninterrupted", *TRAIN)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == STEPS and summary["resumed_from"] is None
    return weights_sha(root, "uninterrupted")


@dataclass
class Terminated:
    returncode: int
    last_step: int  # the last step logged
    stopped: re.Match[str] | None  # the "SIGTERM: stopped ..." line
    stderr: str
    sigterm_to_exit_s: float


def sigterm_after(cmd: list[str], at: int, signal_whom) -> Terminated:
    """Run ``cmd``; once it logs step ``at``, SIGTERM ``signal_whom(proc)`` (the pids)."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=job_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    sent, last, stopped, lines = None, 0, None, []
    try:
        for line in iter(proc.stderr.readline, ""):
            lines.append(line)
            if m := _STOPPED.search(line):
                stopped = stopped or m
            elif (m := _STEP.search(line)) and "SIGTERM" not in line:
                last = max(last, int(m.group(1)))
                if sent is None and last >= at:
                    for pid in signal_whom(proc):
                        os.kill(pid, signal.SIGTERM)
                    sent = time.perf_counter()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sent is not None, "".join(lines[-30:])
    return Terminated(proc.returncode, last, stopped, "".join(lines), time.perf_counter() - sent)


def _checkpoint_meta(root: str, run_id: str, step: int) -> tuple[dict, dict]:
    store = ArtifactStore(root)
    directory = layout.checkpoint("tiny", run_id, step)
    meta = json.loads(store.read_bytes(f"{directory}/meta.json"))
    raw = io.BytesIO(store.read_bytes(f"{directory}/{STATE}"))
    state = torch.load(raw, map_location="cpu", weights_only=True)
    return meta, state


def test_sigterm_off_the_interval_checkpoints_that_step_exits_75_and_the_retry_is_bit_exact(
    root, reference
):
    run_id = "sigterm"
    cmd = [sys.executable, "-m", "embedfresh.jobs.train"]
    for s in (f"artifact_root={root}", f"run_id={run_id}", *TRAIN):
        cmd += ["--set", s]
    stopped = sigterm_after(cmd, SIGTERM_AFTER, lambda proc: [proc.pid])
    tail = stopped.stderr[-3000:]
    assert stopped.returncode == 75, tail
    assert stopped.stopped is not None, tail
    step = int(stopped.stopped.group(1))
    # The step in progress was finished and none after it began: the checkpoint is of the
    # last step logged, off the interval (the signal came after step 10 was logged).
    assert step == stopped.last_step and SIGTERM_AFTER <= step < 2 * CHECKPOINT_EVERY, tail
    assert step % CHECKPOINT_EVERY != 0, tail
    assert int(stopped.stopped.group(3)) == step
    url = stopped.stopped.group(4)
    assert url == ArtifactStore(root).url(layout.checkpoint("tiny", run_id, step))
    assert f"train: error: stopped by SIGTERM after step {step}/{STEPS}" in stopped.stderr
    # A normal committed checkpoint: verifies, is the one load() picks, keep_last intact.
    meta, state = _checkpoint_meta(root, run_id, step)
    mgr = CheckpointManager(ArtifactStore(root), "tiny", run_id, 2, meta["config_hash"])
    assert mgr.committed_steps() == [CHECKPOINT_EVERY, step]
    assert mgr.load().step == step and meta["step"] == step
    assert {"optimizer", "schedule", "rng"} <= state.keys()

    retry = attempt(root, run_id, None)  # asserts exit 0 and a first new step of resumed + 1
    lost = stopped.last_step - retry.resumed_from
    assert retry.resumed_from == step and lost == 0
    assert retry.last_step == STEPS
    assert weights_sha(root, run_id) == reference
    row = dict(
        run=run_id,
        workers=1,
        sigterm_after_logged_step=SIGTERM_AFTER,
        stopped_at_step=step,
        steps_lost=lost,
        sigterm_to_committed_s=float(stopped.stopped.group(5)),  # as the job measured it
        sigterm_to_exit_s=round(stopped.sigterm_to_exit_s, 3),
        retry_to_first_step_s=round(retry.first_step_s, 3),
        checkpoint_every=CHECKPOINT_EVERY,
    )
    figures.ROWS.setdefault("sigterm", []).append(row)
    print(f"SIGTERM figures: {json.dumps(row, sort_keys=True)}")
    assert stopped.sigterm_to_exit_s < preemption.DEFAULT_GRACE_S


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(proc: subprocess.Popen, rank: int) -> list[int]:
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank):
                return [child.pid]
        except psutil.Error:
            continue
    raise AssertionError(f"no worker of rank {rank} under the launcher")


def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(root):
    run_id = "sigterm-ddp"
    cmd = [sys.executable, "-m", "embedfresh.jobs.launch", "--nproc-per-node", "2"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
    cmd += ["-m", "embedfresh.jobs.train"]
    sets = (f"artifact_root={root}", f"run_id={run_id}", *TRAIN, "max_steps=20")
    for s in sets:
        cmd += ["--set", s]
    # Rank 1 alone: it writes nothing, so rank 0's checkpoint proves the ranks agreed.
    stopped = sigterm_after(cmd, SIGTERM_AFTER, lambda proc: _rank(proc, 1))
    tail = stopped.stderr[-4000:]
    assert stopped.returncode == 75, tail  # the launcher passes the workers' 75 on
    lines = re.findall(r"SIGTERM: stopped after step (\d+)/20; checkpoint step (\d+)", tail)
    assert len(lines) == 2, tail  # both ranks stopped ...
    assert len(set(lines)) == 1, tail  # ... at the same step, with its checkpoint
    step = int(lines[0][0])
    assert SIGTERM_AFTER <= step < 2 * CHECKPOINT_EVERY and step % CHECKPOINT_EVERY, tail
    meta, state = _checkpoint_meta(root, run_id, step)
    assert meta["step"] == step and len(state["rng_ranks"]) == 2  # both ranks' RNG streams
    mgr = CheckpointManager(ArtifactStore(root), "tiny", run_id, 2, meta["config_hash"])
    assert mgr.committed_steps() == [CHECKPOINT_EVERY, step]
    row = dict(
        run=run_id,
        workers=2,
        sigterm_after_logged_step=SIGTERM_AFTER,
        stopped_at_step=step,
        sigterm_to_exit_s=round(stopped.sigterm_to_exit_s, 3),
        checkpoint_every=CHECKPOINT_EVERY,
    )
    figures.ROWS.setdefault("sigterm", []).append(row)
    print(f"SIGTERM figures: {json.dumps(row, sort_keys=True)}")
