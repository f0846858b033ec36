"""The health job as real programs: ``python -m embedfresh.jobs.health`` alone and under
``torchrun --nproc-per-node 2`` on cpu/gloo, healthy and with injected faults.

Faults come from ``tests/health_faults/sitecustomize.py`` put on PYTHONPATH (it
corrupts rank 1's all-reduce contribution or every matmul); the Neuron tools are the
stand-ins in ``tests/health_faults/bin`` printing the documented outputs kept in
``tests/fixtures/neuron``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from embedfresh.core.exit_codes import ExitCode
from embedfresh.ml.health.collectives import aggregate, bus_bandwidth, elements_for
from embedfresh.ml.health.report import guarded
from tests.conftest import ROOT, job_env, run_job

FAULTS = ROOT / "tests" / "health_faults"
FIXTURES = ROOT / "tests" / "fixtures" / "neuron"
SMALL = ["collective_sizes=[4096,65536]", "collective_iters=2", "memory_bytes=1048576"]


def _root(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'store'}"


def _report(root: str, run_id: str) -> dict[str, Any]:
    path = Path(root.removeprefix("file://")) / f"runs/tiny/{run_id}/reports/health.json"
    return json.loads(path.read_text())


def _torchrun(*sets: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--standalone", "-m", "embedfresh.jobs.health"]  # a free rendezvous port: no clash
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(
        cmd, cwd=ROOT, env=job_env(env), capture_output=True, text=True, timeout=300
    )


def _fault_env(fault: str) -> dict[str, str]:
    return {"HEALTH_FAULT": fault, "PYTHONPATH": str(FAULTS)}


def _error_line(result: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("health: error:")]
    assert lines, result.stderr[-3000:]
    return lines[-1]


def test_single_process_on_cpu_passes_and_says_collectives_are_trivial(tmp_path: Path) -> None:
    root = _root(tmp_path)
    result = run_job("health", f"artifact_root={root}", "run_id=one", *SMALL)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    report = _report(root, "one")
    assert summary["verdict"] == report["verdict"] == "PASS"
    assert summary["report"].endswith("runs/tiny/one/reports/health.json")
    assert report["failed"] == [] and report["backend"] == "cpu" and report["world_size"] == 1
    created = dt.datetime.fromisoformat(report["created_at"])
    assert created.utcoffset() == dt.timedelta(0)
    (rank,) = report["ranks"]
    assert rank["rank"] == 0 and rank["host"] and rank["device"] == "cpu"
    names = {c["name"] for c in rank["checks"]}
    assert {"device_count", "tensor.matmul", "tensor.sum", "tensor.exp", "tensor.nan_inf"} <= names
    assert "memory_alloc" in names
    for c in rank["checks"]:
        assert c["passed"] is True and c["detail"], c
    matmul = next(c for c in rank["checks"] if c["name"] == "tensor.matmul")
    assert 0 <= matmul["rel_err"] < matmul["tolerance"] == report["tensor_rtol"]
    assert report["collectives_trivial"] is True
    assert len(report["collectives"]) == 3 * 2
    for c in report["collectives"]:
        assert c["trivial"] is True and c["passed"] is True and c["busbw_gbps"] == 0.0


def test_two_ranks_under_torchrun_pass_and_report_bus_bandwidth_per_size(tmp_path: Path) -> None:
    root = _root(tmp_path)
    result = _torchrun(f"artifact_root={root}", "run_id=two", "expected_world_size=2", *SMALL)
    assert result.returncode == 0, result.stderr[-3000:]
    report = _report(root, "two")
    assert report["verdict"] == "PASS" and report["world_size"] == 2, report["failed"]
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert report["collectives_trivial"] is False
    seen = {(c["op"], c["size_bytes"]) for c in report["collectives"]}
    assert seen == {(op, s) for op in ("all_reduce", "all_gather", "reduce_scatter")
                    for s in (4096, 65536)}  # fmt: skip
    for c in report["collectives"]:
        assert c["passed"] and not c["trivial"] and c["ranks_failed"] == []
        assert c["algbw_gbps"] > 0 and c["time_us"] > 0
        # nccl-tests factors at n=2: all-reduce 2(n-1)/n = 1, the others (n-1)/n = 0.5
        factor = 1.0 if c["op"] == "all_reduce" else 0.5
        assert c["busbw_gbps"] == pytest.approx(c["algbw_gbps"] * factor, rel=1e-4)
        assert c["implementation"] in ("native", "all_reduce+slice")
    for rank in report["ranks"]:
        coll = [c for c in rank["checks"] if c["name"].startswith("all_")]
        assert coll and all(c["passed"] and c["mismatches"] == 0 for c in coll)


def test_corrupted_all_reduce_on_rank_1_fails_with_exit_4_naming_the_check(
    tmp_path: Path,
) -> None:
    root = _root(tmp_path)
    result = _torchrun(
        f"artifact_root={root}", "run_id=bad-link", *SMALL, env=_fault_env("all_reduce_rank1")
    )
    assert result.returncode != 0
    # torchrun itself exits 1; each worker's own code is in its failure summary.
    assert "exitcode  : 4" in result.stderr, result.stderr[-3000:]
    assert "all_reduce.4096B" in _error_line(result)
    report = _report(root, "bad-link")
    assert report["verdict"] == "FAIL"
    bad = {c["name"] for c in report["collectives"] if not c["passed"]}
    assert bad == {"all_reduce.4096B", "all_reduce.65536B"}
    assert {"all_reduce.4096B", "rank1/all_reduce.4096B"} <= set(report["failed"])
    assert not any("all_gather" in n or "reduce_scatter" in n or "tensor" in n
                   for n in report["failed"])  # fmt: skip
    wrong = next(c for c in report["collectives"] if c["name"] == "all_reduce.4096B")
    assert wrong["ranks_failed"] == [0, 1]


def test_missing_reduce_scatter_is_emulated_and_says_so(tmp_path: Path) -> None:
    root = _root(tmp_path)
    result = _torchrun(
        f"artifact_root={root}", "run_id=old-gloo", "collective_ops=[\"reduce_scatter\"]",
        *SMALL, env=_fault_env("no_reduce_scatter"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = _report(root, "old-gloo")
    assert report["verdict"] == "PASS"
    for c in report["collectives"]:
        assert c["implementation"] == "all_reduce+slice" and c["passed"]
    for rank in report["ranks"]:
        coll = [c for c in rank["checks"] if c["name"].startswith("reduce_scatter")]
        assert all("no native reduce_scatter" in c["detail"] for c in coll)


def test_a_check_that_raises_fails_with_the_exception_as_detail() -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    result = guarded("memory_alloc", broken)
    assert result["passed"] is False and result["name"] == "memory_alloc"
    assert result["detail"] == (
        "raised RuntimeError: CUDA error: an illegal memory access was encountered"
    )


def test_corrupted_matmul_fails_with_exit_4_naming_the_check(tmp_path: Path) -> None:
    root = _root(tmp_path)
    result = run_job(
        "health", f"artifact_root={root}", "run_id=bad-mm", "collectives=false",
        "memory_bytes=1048576", env=_fault_env("matmul"),
    )  # fmt: skip
    assert result.returncode == ExitCode.UNHEALTHY, result.stderr[-3000:]
    assert not any(ln.startswith("{") for ln in result.stdout.splitlines()), "printed a summary"
    assert "rank0/tensor.matmul" in _error_line(result)
    report = _report(root, "bad-mm")
    assert report["verdict"] == "FAIL" and report["failed"] == ["rank0/tensor.matmul"]
    matmul = next(c for c in report["ranks"][0]["checks"] if c["name"] == "tensor.matmul")
    assert matmul["rel_err"] > matmul["tolerance"]


def test_single_process_on_xla_passes(tmp_path: Path) -> None:
    """The same checks through torch-xla (PJRT_DEVICE=CPU here, Neuron on trn1): the
    XLA collectives need torchrun, so at world size 1 they are identities, said so."""
    root = _root(tmp_path)
    result = run_job(
        "health", f"artifact_root={root}", "run_id=xla", "backend=xla", *SMALL,
        env={"PJRT_DEVICE": "CPU"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = _report(root, "xla")
    assert report["verdict"] == "PASS" and report["backend"] == "xla"
    assert report["ranks"][0]["device"].startswith("xla")
    assert all(c["trivial"] and c["passed"] for c in report["collectives"])


def test_ranks_that_do_not_form_one_world_are_unhealthy(tmp_path: Path) -> None:
    """Two torchrun ranks on xla with PJRT_DEVICE=CPU each get a one-device XLA world
    (torch-xla 2.9): the job must say the ranks cannot reach each other, not hang or
    crash on the report exchange."""
    root = _root(tmp_path)
    result = _torchrun(
        f"artifact_root={root}", "run_id=split", "backend=xla", "collective_sizes=[4096]",
        "collective_iters=1", "memory_bytes=1048576", env={"PJRT_DEVICE": "CPU"},
    )  # fmt: skip
    assert result.returncode != 0 and "exitcode  : 4" in result.stderr, result.stderr[-3000:]
    report = _report(root, "split")
    assert report["verdict"] == "FAIL" and "process_group" in report["failed"]
    check = next(c for c in report["checks"] if c["name"] == "process_group")
    assert "started 2 ranks" in check["detail"] and "holds 1" in check["detail"]


def test_wrong_world_size_is_unhealthy(tmp_path: Path) -> None:
    root = _root(tmp_path)
    result = run_job(
        "health", f"artifact_root={root}", "run_id=ws", "expected_world_size=2", *SMALL
    )
    assert result.returncode == ExitCode.UNHEALTHY, result.stderr[-3000:]
    assert _report(root, "ws")["failed"] == ["world_size"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_missing_cuda_device_is_unhealthy_not_bad_input(tmp_path: Path) -> None:
    root = _root(tmp_path)
    result = run_job("health", f"artifact_root={root}", "run_id=nogpu", "backend=cuda")
    assert result.returncode == ExitCode.UNHEALTHY, result.stderr[-3000:]
    report = _report(root, "nogpu")
    assert report["failed"] == ["rank0/device_count"] and report["backend"] == "cuda"


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("collective_sizes=[2]", "collective_sizes"),
        ('collective_ops=["broadcast"]', "collective_ops"),
        ("tensor_rtol=0", "tensor_rtol"),
        ('min_busbw_gbps={"all_reduce":-1}', "floors"),
        ("neuron_tools=sometimes", "neuron_tools"),
        ("backend=tpu", "unknown backend"),
        ("no_such_field=1", "no_such_field"),
    ],
)
def test_bad_config_exits_2_with_one_line_and_no_report(
    tmp_path: Path, setting: str, words: str
) -> None:
    root = _root(tmp_path)
    result = run_job("health", f"artifact_root={root}", "run_id=cfg", setting)
    assert result.returncode == ExitCode.BAD_INPUT, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "{" not in result.stdout
    assert words in _error_line(result)
    assert not Path(root.removeprefix("file://"), "runs").exists()


def _neuron_env(tmp_path: Path, nccom: str, **extra: str) -> dict[str, str]:
    return {
        "PATH": f"{FAULTS / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "NEURON_STANDIN_LOG": str(tmp_path / "argv.log"),
        "NEURON_LS_OUTPUT": str(FIXTURES / "neuron-ls-trn1.32xlarge.json"),
        "NCCOM_TEST_OUTPUT": str(FIXTURES / nccom),
        **extra,
    }


def test_neuron_tools_path_parses_neuron_ls_and_nccom_test(tmp_path: Path) -> None:
    root = _root(tmp_path)
    result = run_job(
        "health", f"artifact_root={root}", "run_id=trn", "neuron_tools=on",
        "expected_neuron_devices=16", "nccom_min_busbw_gbps=40", "collectives=false",
        "memory_bytes=1048576", env=_neuron_env(tmp_path, "nccom-test-allr-sweep.txt"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    calls = (tmp_path / "argv.log").read_text().splitlines()
    assert calls[0] == "neuron-ls -j"
    for call, op in zip(calls[1:], ("allr", "allg", "redsct"), strict=True):
        assert call.startswith("nccom-test -r 32 ") and call.endswith(f"-d fp32 --check {op}")
    report = _report(root, "trn")
    (tools,) = report["neuron_tools"]
    assert tools["rank"] == 0 and len(tools["neuron_ls"]) == 16
    assert tools["nccom_test"]["allr"]["rows"][-1]["busbw_gibps"] == 52.83
    checks = {c["name"]: c for c in report["ranks"][0]["checks"]}
    assert checks["neuron_ls"]["cores"] == 32 and checks["nccom_test.redsct"]["passed"]


@pytest.mark.parametrize(
    ("nccom", "extra", "failed"),
    [
        ("nccom-test-failed-size.txt", {"NCCOM_TEST_RC": "1"}, "nccom_test.allr"),
        ("nccom-test-no-driver.txt", {"NCCOM_TEST_RC": "1"}, "nccom_test.allr"),
        ("nccom-test-allr-sweep.txt", {"NEURON_LS_OUTPUT": "/dev/null"}, "neuron_ls"),
    ],
)
def test_neuron_tool_failures_are_unhealthy(
    tmp_path: Path, nccom: str, extra: dict[str, str], failed: str
) -> None:
    root = _root(tmp_path)
    result = run_job(
        "health", f"artifact_root={root}", "run_id=trn-bad", "neuron_tools=on",
        "nccom_ranks=2", "collectives=false", "memory_bytes=1048576",
        env=_neuron_env(tmp_path, nccom, **extra),
    )  # fmt: skip
    assert result.returncode == ExitCode.UNHEALTHY, result.stderr[-3000:]
    assert f"rank0/{failed}" in _report(root, "trn-bad")["failed"]
    assert failed in _error_line(result)


def test_neuron_tools_missing_on_path_fail_the_check(tmp_path: Path) -> None:
    root = _root(tmp_path)
    result = run_job(
        "health", f"artifact_root={root}", "run_id=no-tools", "neuron_tools=on",
        "nccom_ops=[\"allr\"]", "collectives=false", "memory_bytes=1048576",
        env={"PATH": str(Path(sys.executable).parent)},
    )  # fmt: skip
    assert result.returncode == ExitCode.UNHEALTHY, result.stderr[-3000:]
    checks = {c["name"]: c for c in _report(root, "no-tools")["ranks"][0]["checks"]}
    assert "not found on PATH" in checks["neuron_ls"]["detail"]
    assert not checks["nccom_test.allr"]["passed"]


def test_bus_bandwidth_factors_and_sizes() -> None:
    assert bus_bandwidth("all_reduce", 10.0, 8) == pytest.approx(17.5)
    assert bus_bandwidth("all_gather", 10.0, 8) == pytest.approx(8.75)
    assert bus_bandwidth("reduce_scatter", 10.0, 4) == pytest.approx(7.5)
    assert elements_for(4096, 3) == 1023 and elements_for(4, 8) == 8


def _record(op: str, size: int, seconds: float, passed: bool = True) -> dict[str, Any]:
    return {"op": op, "size_bytes": size, "trivial": False, "seconds": seconds,
            "check": {"passed": passed}}  # fmt: skip


def test_aggregate_takes_the_slowest_rank_and_applies_floors_from_a_size_on() -> None:
    per_rank = [
        [_record("all_reduce", 1000, 1e-6), _record("all_reduce", 4_000_000, 1e-3)],
        [_record("all_reduce", 1000, 2e-6), _record("all_reduce", 4_000_000, 2e-3, False)],
    ]
    small, large = aggregate(per_rank, 2, {"all_reduce": 5.0}, floor_min_size=1 << 20)
    assert small["algbw_gbps"] == pytest.approx(0.5) and small["passed"]  # 1000 B / 2 us
    assert "min_busbw_gbps" not in small  # below the floor's minimum size
    assert large["algbw_gbps"] == pytest.approx(2.0) and large["min_busbw_gbps"] == 5.0
    assert not large["passed"] and large["ranks_failed"] == [1]
    fast = [[_record("all_reduce", 4_000_000, 1e-4)], [_record("all_reduce", 4_000_000, 1e-4)]]
    (ok,) = aggregate(fast, 2, {"all_reduce": 5.0}, floor_min_size=1 << 20)
    assert ok["busbw_gbps"] == pytest.approx(40.0) and ok["passed"]
    (low,) = aggregate(fast, 2, {"all_reduce": 50.0}, floor_min_size=1 << 20)
    assert not low["passed"] and "floor 50.0" in low["detail"]


def test_the_operator_fails_without_retry_when_a_rank_is_faulty_under_torchrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the operator and the local runner (embedfresh.jobs.launch): exit 4 stays 4, not torchrun's 1."""
    from airflow.sdk.exceptions import AirflowFailException

    from embedfresh.operators import AcceleratorHealthOperator

    for key, value in job_env().items():
        monkeypatch.setenv(key, value)
    health = AcceleratorHealthOperator(
        task_id="health",
        model="tiny",
        artifact_root=_root(tmp_path),
        run_id="op-bad-link",
        nproc_per_node=2,
        job_settings={k: json.loads(v) for k, v in (s.split("=", 1) for s in SMALL)},
        env=_fault_env("all_reduce_rank1"),
    )
    with pytest.raises(AirflowFailException, match="exit code 4"):
        health.execute(context={})
    assert _report(_root(tmp_path), "op-bad-link")["verdict"] == "FAIL"
