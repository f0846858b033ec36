"""``bench/gpu.py``, the one command that takes issue 18's GPU figures, kept runnable on
machines without a GPU: it refuses with exit 2 and the reason when no CUDA device is
visible, and its code (the embed comparison and the train job's step loop with FLOP
counting against a matmul peak) runs for real on the CPU at toy sizes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "gpu.py"


def _run(*args: str, script: Path = BENCH, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_without_a_gpu_it_refuses_and_says_why() -> None:
    done = _run(CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "no CUDA device is visible" in done.stderr
    assert "## GPU figures" not in done.stdout


def test_its_parts_run_on_the_cpu_at_toy_sizes(tmp_path: Path) -> None:
    before = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    done = _run("--device", "cpu", "--quick", "--parts", "embed,train")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "## GPU figures on CPU" in out and "Not a GPU run" in out
    # embed: both variants timed, every vector compared with sentence-transformers fp32
    ours = re.search(r"\| ours \(embed job path.*?\| ([\d.]+) \| ([\d.]+)x \| ([\d.]+) \|", out)
    assert ours, out
    assert float(ours.group(1)) > 0 and float(ours.group(3)) > 0.9999
    # train: the job's step loop at the config's batch and at the filling batch, FLOPs
    # counted and set against a matmul peak measured in the same run
    # (--quick times the eager step only: a cold CPU compile would add a minute)
    cells = (
        r"\| (\d+) x (config|\d+) \| (eager|compiled) \| (\d+) \|.*"
        r"\| ([\d.]+) \| [\d.]+ \(float32\) \| (\d+)% \|"
    )
    rows = re.findall(cells, out)
    assert [r[:3] for r in rows] == [("32", "config", "eager"), ("16", "32", "eager")], out
    assert all(float(r[4]) > 0 and 0 < int(r[5]) <= 100 for r in rows), rows
    # a smoke run never adds figures to the benchmark record
    assert (ROOT / "docs" / "BENCHMARKS.md").read_text() == before


def test_the_reproducibility_check_runs_on_the_cpu() -> None:
    """``bench/reproducible.py``, the GPU session's killed-and-clean check, kept runnable:
    its train check (kill, resume, compare the weights' sha256) on the cpu backend."""
    reproducible = ROOT / "bench" / "reproducible.py"
    done = _run("--backend", "cpu", "--checks", "train", script=reproducible)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    line = json.loads(done.stdout.splitlines()[0])
    assert line["ok"] and line["sha256_through"] == line["sha256_resumed"], line
    assert 0 < line["resumed_from"] < line["killed_after_step"], line
