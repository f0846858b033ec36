"""S3 faults on a real HTTP endpoint: training with its artifact root on S3 (moto's
server) behind a fault-injecting proxy (:mod:`tests.reliability.fault_proxy`).

Each scenario is one training run: injected 503 SlowDown, 500 InternalError, dropped
connections, the endpoint gone and back on the same port with its data, and faults that
outlast the retries. Runs that the retries ride out end bit-identical to a fault-free
run; runs that outlast them exit 75 with one clear line, leave no partial artifact
visible, and the orchestrator's retry (a second attempt, same run id) resumes from the
checkpoint in the bucket and ends bit-identical too.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import boto3
import pytest

from embedfresh.core import layout, markers
from embedfresh.core.exit_codes import ExitCode
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.checkpoint import WEIGHTS
from tests.conftest import ROOT, job_env, write_data
from tests.reliability import figures
from tests.reliability.fault_proxy import (
    DROP,
    INTERNAL,
    SLOW_DOWN,
    Fault,
    FaultPlan,
    FaultProxy,
    always,
    at_rate,
    every,
)
from tests.test_checkpoint import STEPS, train_args

BUCKET = "s3-faults"
MODEL = "tiny"


@pytest.fixture(scope="module")
def s3_data_root(s3_endpoint: str) -> str:
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=BUCKET)
    root = f"s3://{BUCKET}/prod"
    write_data(root)
    return root


def start_training(root: str, run_id: str, endpoint: str, env: dict[str, str] | None = None):
    cmd = [sys.executable, "-m", "embedfresh.jobs.train"]
    for s in train_args(root, run_id):
        cmd += ["--set", s]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=job_env({"AWS_ENDPOINT_URL": endpoint, **(env or {})}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(
    proc: subprocess.Popen, on_line: Callable[[str], None] | None = None, timeout: float = 600
) -> tuple[int, str, str]:
    """Stream stderr (calling ``on_line`` for each line) until the job exits."""
    lines = []
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    try:
        for line in iter(proc.stderr.readline, ""):
            lines.append(line)
            if on_line is not None:
                on_line(line)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=30)
    return proc.returncode, "".join(out), "".join(lines)


def all_at_once(names: list[str], run: Callable[[str], dict]) -> dict[str, dict]:
    """``run(name)`` for every name in its own thread; the results by name."""
    results: dict[str, dict] = {}

    def one(name: str) -> None:
        results[name] = run(name)

    threads = [threading.Thread(target=one, args=(name,)) for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    return results


def weights_sha(root: str, run_id: str) -> str:
    store = ArtifactStore(root)
    data = store.read_bytes(f"{layout.model_version(MODEL, run_id)}/{WEIGHTS}")
    return hashlib.sha256(data).hexdigest()


def assert_nothing_partial_visible(root: str, run_id: str, finished: bool) -> None:
    """Every marker in the run's and the version's folders verifies; without a finished
    run there is no committed version and no report."""
    store = ArtifactStore(root)
    for step_dir in store.listdir(layout.checkpoints(MODEL, run_id)):
        directory = f"{layout.checkpoints(MODEL, run_id)}/{step_dir}"
        if store.exists(f"{directory}/{markers.COMMIT}"):
            check = markers.verify(store, directory)
            assert check.ok, f"{directory}: {check.reason}"
    version = layout.model_version(MODEL, run_id)
    report = layout.report(MODEL, run_id, "train")
    if finished:
        assert markers.verify(store, version).ok
        assert store.exists(report)
    else:
        assert not store.exists(f"{version}/{markers.COMMIT}")
        assert not store.exists(report)


@pytest.fixture(scope="module")
def reference(s3_endpoint: str, s3_data_root: str) -> str:
    """A fault-free run through a transparent proxy: the weights every run must match."""
    with FaultProxy(s3_endpoint) as p:
        code, out, err = finish(start_training(s3_data_root, "reference", p.endpoint))
        assert code == 0, err[-3000:]
        assert p.plan.requests > 0, "the job did not go through the proxy"
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == STEPS and summary["resumed_from"] is None
    return weights_sha(s3_data_root, "reference")


def _record(name: str, proxy: FaultProxy, first_exit: int, attempts: int, ok: bool, **extra):
    figures.record(
        "faults",
        scenario=name,
        requests=proxy.plan.requests,
        faults_injected=sum(proxy.plan.injected.values()) + proxy.outages,
        first_attempt_exit=first_exit,
        attempts=attempts,
        completed_correctly=ok,
        **extra,
    )


def _after_checkpoint(step: int, action: Callable[[], None]) -> Callable[[str], None]:
    """An ``on_line`` callback that runs ``action`` once checkpoint ``step`` committed."""
    fired = []

    def on_line(line: str) -> None:
        if not fired and f"checkpoint step {step} committed" in line:
            fired.append(True)
            action()

    return on_line


def _outage(seconds: float) -> Callable[[FaultProxy], Callable[[str], None]]:
    """The endpoint vanishes (listening socket and open connections closed) just after
    checkpoint 14 and comes back ``seconds`` later on the same port, data intact."""

    def arm(proxy: FaultProxy) -> Callable[[str], None]:
        def go_down() -> None:
            proxy.down()
            threading.Timer(seconds, proxy.up).start()

        return _after_checkpoint(14, go_down)

    return arm


# name -> (fault rule, on_line callback built for the run's proxy)
RIDDEN_OUT: dict[str, tuple[Callable[[str, str, int], Fault], Callable | None]] = {
    "every-4th-request-503-slowdown": (every(4, SLOW_DOWN), None),
    "15pct-requests-500-internal-error": (at_rate(0.15, INTERNAL, seed=8), None),
    "every-5th-connection-dropped": (every(5, DROP), None),
    "endpoint-down-4s-and-back": (lambda method, path, n: None, _outage(4.0)),
}


@pytest.fixture(scope="module")
def ridden_out(s3_endpoint: str, s3_data_root: str, reference: str) -> dict[str, dict]:
    """Every scenario of :data:`RIDDEN_OUT` as one training run, all at once: most of
    their time is spent backing off, not computing."""

    def run(name: str) -> dict:
        rule, arm = RIDDEN_OUT[name]
        with FaultProxy(s3_endpoint, FaultPlan(rule)) as proxy:
            started = time.perf_counter()
            code, out, err = finish(
                start_training(s3_data_root, name, proxy.endpoint),
                on_line=None if arm is None else arm(proxy),
            )
        return dict(code=code, err=err, wall_s=round(time.perf_counter() - started, 2), proxy=proxy)

    return all_at_once(list(RIDDEN_OUT), run)


@pytest.mark.parametrize("scenario", list(RIDDEN_OUT))
def test_faults_the_retries_ride_out_leave_the_run_bit_exact(
    s3_data_root, reference, ridden_out, scenario
):
    result = ridden_out[scenario]
    proxy = result["proxy"]
    code = result["code"]
    ok = code == 0 and weights_sha(s3_data_root, scenario) == reference
    _record(scenario, proxy, code, 1, ok, wall_s=result["wall_s"])
    assert code == 0, result["err"][-3000:]
    if RIDDEN_OUT[scenario][1] is None:
        assert sum(proxy.plan.injected.values()) >= 5, proxy.plan.injected
    else:
        assert proxy.outages == 1 and "checkpoint step 21 committed" in result["err"]
    assert weights_sha(s3_data_root, scenario) == reference
    assert_nothing_partial_visible(s3_data_root, scenario, finished=True)


def _assert_transient_exit(code: int, out: str, err: str) -> None:
    assert code == ExitCode.TRANSIENT, (code, err[-3000:])
    assert out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith("train: error: "), err[-3000:]
    assert "unreachable" in last or "transient" in last, last


# Faults that outlast the retries (2 attempts a request for the test's sake): the first
# attempt exits 75; the second, with the endpoint healthy, resumes from checkpoint 14.
OUTLASTING: dict[str, Callable[[FaultProxy], Callable[[], None]]] = {
    "endpoint-down-until-the-job-gives-up": lambda p: p.down,
    "503-slowdown-on-every-request": lambda p: lambda: setattr(p.plan, "rule", always(SLOW_DOWN)),
}


def _outlast_then_retry(s3_endpoint: str, root: str, name: str) -> dict:
    with FaultProxy(s3_endpoint) as proxy:
        code, out, err = finish(
            start_training(root, name, proxy.endpoint, env={"AWS_MAX_ATTEMPTS": "2"}),
            on_line=_after_checkpoint(14, OUTLASTING[name](proxy)),
        )
        injected = sum(proxy.plan.injected.values())
        proxy.plan.rule = lambda method, path, n: None
        proxy.up()
        partial_error = None
        try:
            assert_nothing_partial_visible(root, name, finished=False)
        except AssertionError as e:  # checked once the retry has run too
            partial_error = str(e)
        retry = finish(start_training(root, name, proxy.endpoint))
    return dict(
        first=(code, out, err),
        retry=retry,
        partial_error=partial_error,
        requests=proxy.plan.requests,
        outages=proxy.outages,
        injected=injected,
    )


@pytest.fixture(scope="module")
def outlasted(s3_endpoint: str, s3_data_root: str, reference: str) -> dict[str, dict]:
    """Every scenario of :data:`OUTLASTING`, all at once: first attempt, then retry."""
    return all_at_once(
        list(OUTLASTING), lambda name: _outlast_then_retry(s3_endpoint, s3_data_root, name)
    )


@pytest.mark.parametrize("scenario", list(OUTLASTING))
def test_faults_outlasting_retries_exit_75_then_the_retry_resumes(
    s3_data_root, reference, outlasted, scenario
):
    result = outlasted[scenario]
    code, out, err = result["first"]
    retry_code, retry_out, retry_err = result["retry"]
    ok = retry_code == 0 and weights_sha(s3_data_root, scenario) == reference
    figures.record(
        "faults",
        scenario=scenario,
        requests=result["requests"],
        faults_injected=result["injected"] + result["outages"],
        first_attempt_exit=code,
        attempts=2,
        completed_correctly=ok,
    )
    _assert_transient_exit(code, out, err)
    assert result["injected"] + result["outages"] >= 1
    assert result["partial_error"] is None, result["partial_error"]
    assert retry_code == 0, retry_err[-3000:]
    summary = json.loads(retry_out.strip().splitlines()[-1])
    assert summary["resumed_from"] is not None and summary["resumed_from"]["step"] >= 14
    assert weights_sha(s3_data_root, scenario) == reference
    assert_nothing_partial_visible(s3_data_root, scenario, finished=True)
