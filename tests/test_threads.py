"""Jobs size torch's threads from the CPUs they are given (affinity, cgroup quota), a
setting overrides that and an explicit ``OMP_NUM_THREADS`` wins; OpenMP waits passively;
a resume under another thread count says it is no longer bit-exact."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from embedfresh.core import threads
from tests.conftest import ROOT, job_env


@pytest.fixture
def cgroup(tmp_path, monkeypatch):
    """A fake cgroup tree: ``write(v2=..., v1=(quota, period))`` lays out one."""
    proc = tmp_path / "proc-cgroup"
    root = tmp_path / "cgroup"
    monkeypatch.setattr(threads, "PROC_CGROUP", proc)
    monkeypatch.setattr(threads, "CGROUP_ROOT", root)

    def write(v2: str | None = None, v1: tuple[int, int] | None = None) -> None:
        if v2 is not None:
            (root / "job.slice").mkdir(parents=True)
            (root / "job.slice" / "cpu.max").write_text(v2 + "\n")
            proc.write_text("0::/job.slice\n")
        else:
            (root / "cpu,cpuacct" / "docker" / "abc").mkdir(parents=True)
            (root / "cpu" / "docker" / "abc").mkdir(parents=True)
            quota, period = v1
            (root / "cpu" / "docker" / "abc" / "cpu.cfs_quota_us").write_text(f"{quota}\n")
            (root / "cpu" / "docker" / "abc" / "cpu.cfs_period_us").write_text(f"{period}\n")
            proc.write_text("4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n")

    return write


@pytest.mark.parametrize(
    ("cgroup_files", "affinity", "expected"),
    [
        ({"v2": "150000 100000"}, 16, (2, 1.5)),  # a Batch container: 1.5 vCPUs of 16
        ({"v2": "max 100000"}, 6, (6, None)),
        ({"v1": (400000, 100000)}, 64, (4, 4.0)),
        ({"v1": (-1, 100000)}, 3, (3, None)),  # v1's "no quota"
        ({"v2": "800000 100000"}, 2, (2, 8.0)),  # pinned to 2 cores: the affinity caps
    ],
)
def test_threads_follow_the_cpus_given(monkeypatch, cgroup, cgroup_files, affinity, expected):
    cgroup(**cgroup_files)
    monkeypatch.setattr(threads, "affinity_cpus", lambda: affinity)
    plan = threads.thread_plan({})
    assert (plan.intra_op, plan.quota) == expected
    assert plan.inter_op == plan.intra_op and plan.source == "cpus given"


def test_the_setting_overrides_and_omp_num_threads_wins(monkeypatch, cgroup):
    cgroup(v2="100000 100000")
    monkeypatch.setattr(threads, "affinity_cpus", lambda: 8)
    assert threads.thread_plan({}).intra_op == 1
    plan = threads.thread_plan({"EMBEDFRESH_THREADS": "3"})
    assert (plan.intra_op, plan.source) == (3, "EMBEDFRESH_THREADS")
    plan = threads.thread_plan({"EMBEDFRESH_THREADS": "3", "OMP_NUM_THREADS": "5,2"})
    assert (plan.intra_op, plan.source) == (5, "OMP_NUM_THREADS")
    with pytest.raises(ValueError, match="EMBEDFRESH_THREADS must be a whole number"):
        threads.thread_plan({"EMBEDFRESH_THREADS": "all"})


def test_job_processes_set_a_passive_wait_policy_before_torch_starts():
    code = (
        "import os, sys, embedfresh.jobs; "
        "print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)"
    )
    env = {k: v for k, v in job_env().items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["PASSIVE", "False"], out.stderr
    env["OMP_WAIT_POLICY"] = "ACTIVE"  # an operator's own choice is kept
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["ACTIVE", "False"], out.stderr


def _report_threads(tmp_path: Path, prefix: list[str], extra: dict[str, str]) -> tuple[int, str]:
    """Run the health job (the cheapest job that builds a backend) under ``prefix``; its
    report's thread count and the job's stderr."""
    root = f"file://{tmp_path / 'store'}"
    env = {k: v for k, v in job_env().items() if k != "OMP_NUM_THREADS"}
    env.update(extra)
    cmd = [*prefix, sys.executable, "-m", "embedfresh.jobs.health"]
    cmd += ["--set", f"artifact_root={root}", "--set", "run_id=t"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "store/runs/tiny/t/reports/health.json").read_text())
    return report["ranks"][0]["backend"]["threads"], done.stderr


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs util-linux's taskset")
def test_a_job_pinned_to_one_cpu_runs_one_thread(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a host with two CPUs to pin a job to one of them")
    threads_used, log = _report_threads(tmp_path, ["taskset", "-c", "0"], {})
    assert threads_used == 1
    assert "threads: 1 intra-op, 1 inter-op (cpus given; 1 CPUs in affinity" in log
    threads_used, _ = _report_threads(tmp_path, ["taskset", "-c", "0"], {"EMBEDFRESH_THREADS": "2"})
    assert threads_used == 2
