"""torch.compile vs eager training on cpu, through the real jobs: what ``compile=auto``
picks (:data:`embedfresh.ml.compile.modes.COMPILE_DEFAULTS`).

Run on demand, not in CI::

    OMP_NUM_THREADS=1 .venv/bin/python bench/compile.py [--models tiny minilm] [--steps 30]

For each model config, one after the other on the same generated data, each in its own
process (``python -m embedfresh.jobs.<name>``): ``eager`` (``train compile=off``), ``cold`` (the
compile job: a trial with an empty inductor directory) and ``warm`` (``train compile=on``
in a fresh process with a fresh inductor directory, restoring the compile job's cache
entry). Steady steps/s excludes the first step: (steps - 1) / (loop seconds - seconds to
first step), the loop seconds taken from the train report's samples/s. Prints a Markdown
table and appends it with the command, machine and date to ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DAY = dt.date(2026, 1, 1)


def run(name: str, sets: list[str], env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", f"embedfresh.jobs.{name}"]
    for s in sets:
        cmd += ["--set", s]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def steady_steps_per_second(report: dict[str, Any]) -> float:
    steps, batch = report["steps_this_attempt"], report["batch_size"]
    loop_seconds = steps * batch / report["samples_per_second"]
    return (steps - 1) / (loop_seconds - report["seconds_to_first_step"])


def bench_model(
    root: str, model: str, steps: int, tmp: Path, env: dict[str, str], backend: str = "cpu"
) -> dict:
    from embedfresh.core import layout
    from embedfresh.core.storage import ArtifactStore

    store = ArtifactStore(root)
    train = [f"artifact_root={root}", f"model={model}", f"data_interval_start={DAY}"]
    train.append(f"backend={backend}")
    train += [f"max_steps={steps}", "init=base", f"checkpoint_every={steps + 1}"]
    out: dict[str, Any] = {"model": model}

    run("train", [*train, f"run_id={model}-eager", "compile=off"], env)
    eager = store.read_json(layout.report(model, f"{model}-eager", "train"))
    out["eager_first"] = eager["seconds_to_first_step"]
    out["eager_sps"] = steady_steps_per_second(eager)

    cold_env = {**env, "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"{model}-cold")}
    compile_sets = [f"artifact_root={root}", f"model={model}", f"run_id={model}-compile"]
    compile_sets.append(f"backend={backend}")
    run("compile", [*compile_sets, "compile=on"], cold_env)
    compiled = store.read_json(layout.report(model, f"{model}-compile", "compile"))
    out["cold_first"] = compiled["cold_seconds_to_first_step"]
    out["entry_bytes"] = compiled["size_bytes"]

    warm_env = {**env, "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"{model}-warm")}
    run("train", [*train, f"run_id={model}-warm", "compile=on"], warm_env)
    warm = store.read_json(layout.report(model, f"{model}-warm", "train"))
    assert warm["compile"]["cache"]["hit"], warm["compile"]
    out["warm_first"] = warm["seconds_to_first_step"]
    out["compiled_sps"] = steady_steps_per_second(warm)
    out["compiles_after_warmup"] = warm["compiles_after_warmup"]
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | eager steps/s | compiled steps/s | compiled/eager | eager first step s "
        "| cold first step s | warm first step s | warm/cold | entry MB | recompiles |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['eager_sps']:.2f} | {r['compiled_sps']:.2f} "
            f"| {r['compiled_sps'] / r['eager_sps']:.2f}x | {r['eager_first']:.1f} "
            f"| {r['cold_first']:.1f} | {r['warm_first']:.1f} "
            f"| {r['warm_first'] / r['cold_first']:.2f} | {r['entry_bytes'] / 1e6:.1f} "
            f"| {r['compiles_after_warmup']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "minilm"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()

    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.data.generate import write_dataset

    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as tmp:
        root = f"file://{tmp}/store"
        write_dataset(ArtifactStore(root), "products", 0, DAY, 1, 2048, 256, "products", 10, 10)
        for model in args.models:
            rows.append(bench_model(root, model, args.steps, Path(tmp), env))
            print(json.dumps(rows[-1]), flush=True)
    command = "OMP_NUM_THREADS={} .venv/bin/python bench/compile.py {}".format(
        env["OMP_NUM_THREADS"], shlex.join(sys.argv[1:])
    ).rstrip()
    section = "\n".join(
        [
            f"\n## torch.compile vs eager training on cpu ({dt.date.today().isoformat()})\n",
            f"- Command: `{command}`",
            f"- Machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
            f"Python {platform.python_version()}, {env['OMP_NUM_THREADS']} torch thread(s); "
            "shared with other work, so treat single figures as noisy",
            f"- {args.steps} training steps per run, default batch size, one run per variant",
            "- cold: the compile job's trial with an empty inductor directory; warm: a train "
            "run in a fresh process and fresh inductor directory restoring that entry "
            "(mega-cache + inductor archive)",
            f"- Wall time of the whole benchmark: {time.perf_counter() - started:.0f} s\n",
            table(rows),
            "",
        ]
    )
    print(section)
    if not args.no_append:
        with open(ROOT / "docs" / "BENCHMARKS.md", "a") as f:
            f.write(section)


if __name__ == "__main__":
    main()
