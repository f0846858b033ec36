"""Pipeline overhead: wall time of a demo DAG run against the sum of its jobs' own wall
times, and where the difference goes.

Run on demand, not in CI::

    .venv/bin/python bench/pipeline_overhead.py [--train-rows 1024] [--epochs 3]
        [--starts 5] [--no-append]

One ``dag.test()`` of ``embedding_model_refresh`` (one daily data interval, tiny, cpu,
the Params' defaults otherwise) in a fresh interpreter against a throw-away AIRFLOW_HOME
(SQLite, ``airflow db migrate`` timed apart: a demo pays it once, a deployment never),
on freshly generated data. Measured:

- the demo's wall time: the ``dag.test()`` interpreter from spawn to exit;
- inside it: Airflow start-up (imports + DagBag parse) and ``dag.test()`` itself;
- per task: the task instance's duration from the metadata DB;
- per job: its own ``wall_seconds`` from its report under ``runs/<model>/<run_id>/reports``
  (tasks whose job writes no report count as all overhead);
- apart, interleaved ``--starts`` times: a bare ``python -c pass``, ``import torch`` and
  ``import embedfresh.jobs.train``, i.e. what every job subprocess pays before its own clock starts.

Overhead = demo wall time - sum of the jobs' wall times; target <= 15% of the demo's wall.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    BENCHMARKS,
    NOISY,
    ROOT,
    bench_env,
    command_line,
    generate_data,
    interleaved,
    machine,
    median,
    publish,
    section,
    table,
)

DAG_ID = "embedding_model_refresh"
DAY = dt.date(2026, 1, 1)
TARGET = 0.15
AIRFLOW = str(Path(sys.executable).with_name("airflow"))

# Runs in the child interpreter: times its own start-up, one dag.test(), then reads
# every task instance's times back from the database. Prints JSON last.
DAG_TEST = r"""
import time
t_start = time.time()
import datetime as dt, json, sys
from sqlalchemy import select
from airflow.dag_processing.dagbag import DagBag
from airflow.models import DagRun, TaskInstance
from airflow.utils.session import create_session

root, folder, dag_id, epochs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
t_imported = time.time()
bag = DagBag(dag_folder=folder)
assert not bag.import_errors, bag.import_errors
dag = bag.dags[dag_id]
# dag.test() in 3.3.2 fails on success with a Deadline Alert (see tests/airflow_home.py)
dag.deadline = None
t_parsed = time.time()
run = dag.test(
    logical_date=dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
    run_conf={"artifact_root": root, "epochs": epochs},
)
t_tested = time.time()
with create_session() as session:
    dr = session.scalars(select(DagRun).where(DagRun.run_id == run.run_id)).one()
    tis = session.scalars(select(TaskInstance).where(TaskInstance.run_id == dr.run_id)).all()
    tasks = [
        [ti.task_id, ti.map_index, str(ti.state), ti.start_date.timestamp(),
         ti.end_date.timestamp()]
        for ti in tis if ti.start_date and ti.end_date
    ]
print(json.dumps({
    "run_id": dr.run_id, "state": str(dr.state), "tasks": tasks, "start": t_start,
    "imported": t_imported, "parsed": t_parsed, "tested": t_tested,
}))
"""


def job_walls(reports: Path) -> dict[str, float]:
    """Each job report's own wall time, by report name. ``eval-*`` reports are written
    inside another job's clock (``eval-step-N`` by train, ``eval-reference`` by the gate)
    and are not counted twice."""
    out = {}
    for path in sorted(reports.glob("*.json")):
        if path.stem.startswith("eval-"):
            continue
        report = json.loads(path.read_text())
        wall = report.get("wall_seconds", report.get("seconds"))
        if isinstance(wall, int | float):
            out[path.stem] = float(wall)
    return out


def task_of(report: str) -> str:
    """The task that writes a report: ``embed-00000-00001`` -> ``embed``, ``eval`` ->
    ``evaluate``."""
    kind = report.split("-", 1)[0]
    return {"eval": "evaluate", "index": "load_index", "search": "search_check"}.get(kind, kind)


#: The job module each task's subprocess imports first (list_shards runs in the worker).
TASK_MODULES = {
    "health": "embedfresh.jobs.health",
    "compile": "embedfresh.jobs.compile",
    "train": "embedfresh.jobs.train",
    "evaluate": "embedfresh.jobs.evaluate",
    "gate": "embedfresh.jobs.gate",
    "embed": "embedfresh.jobs.embed",
    "verify": "embedfresh.jobs.embed_verify",
    "load_index": "embedfresh.jobs.index_load",
    "search_check": "embedfresh.jobs.search_check",
    "release": "embedfresh.jobs.release",
}
IMPORT = "import sys, time; t = time.perf_counter(); import {m}; " + (
    "print(time.perf_counter() - t, 'torch' in sys.modules)"
)


def start_costs(repeats: int, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """What a job subprocess pays before its own clock starts, interleaved: a bare
    interpreter (``pass``), ``import torch``, ``import airflow.sdk`` and each task's job
    module (seconds in a fresh interpreter, and whether it pulled torch in)."""
    torch_pulled: dict[str, bool] = {}

    def timed(name: str, module: str | None):
        def run() -> float:
            started = time.perf_counter()
            code = "pass" if module is None else IMPORT.format(m=module)
            out = subprocess.run(
                [sys.executable, "-c", code], env=env, cwd=ROOT, check=True, capture_output=True
            )
            if module is None:
                return time.perf_counter() - started
            seconds, pulled = out.stdout.split()
            torch_pulled[name] = pulled == b"True"
            return float(seconds)

        return run

    probes = {"python (start only)": timed("python", None)}
    probes["import torch"] = timed("import torch", "torch")
    probes["import airflow.sdk"] = timed("import airflow.sdk", "airflow.sdk")
    for task, module in TASK_MODULES.items():
        probes[f"import {module} ({task})"] = timed(f"import {module} ({task})", module)
    measured = interleaved(probes, repeats)
    return {
        name: {"seconds": values, "torch": torch_pulled.get(name)}
        for name, values in measured.items()
    }


#: A DAG of bare PythonOperator tasks in the demo's shape (seven in a line, three mapped,
#: one last: 11 task instances): what the same tasks cost Airflow itself on this box.
BARE_DAG = """
import datetime as dt
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

with DAG("bench_bare_task", schedule=None, start_date=dt.datetime(2026, 1, 1)) as dag:
    line = [PythonOperator(task_id=f"bare_{i}", python_callable=lambda: None) for i in range(7)]
    mapped = PythonOperator.partial(task_id="bare_mapped", python_callable=lambda x: None).expand(
        op_args=[[0], [1], [2]]
    )
    last = PythonOperator(task_id="bare_last", python_callable=lambda: None)
    for a, b in zip(line, line[1:]):
        a >> b
    line[-1] >> mapped >> last
"""
#: Task instances of the demo run, and of the bare DAG above.
TASK_INSTANCES = 11

#: The variants of one bench run: the local runner's fork server off (every job a fresh
#: interpreter) and on (jobs forked from a server with torch imported; cold: the run's
#: first job starts it).
VARIANTS = {"fresh interpreter": "0", "fork server": "1"}


def dag_test(
    env: dict[str, str], root: str, folder: Path, dag_id: str, epochs: int
) -> tuple[dict, float]:
    """One ``dag.test()`` in a fresh interpreter: the facts it prints, its wall time."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", DAG_TEST, root, str(folder), dag_id, str(epochs)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"dag.test() of {dag_id} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    if facts["state"] != "success":
        sys.exit(f"the {dag_id} run ended {facts['state']}: {facts['tasks']}")
    facts["spawned"] = time.time() - wall
    return facts, wall


def per_task(facts: dict, walls: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Per task id: instances, summed task durations, summed job walls."""
    tasks: dict[str, dict[str, Any]] = {}
    for task_id, _, _, t_start, t_end in facts["tasks"]:
        t = tasks.setdefault(task_id, {"n": 0, "task_s": 0.0, "job_s": 0.0, "reports": 0})
        t["n"] += 1
        t["task_s"] += t_end - t_start
    for report, wall in walls.items():
        t = tasks.setdefault(task_of(report), {"n": 0, "task_s": 0.0, "job_s": 0.0, "reports": 0})
        t["job_s"] += wall
        t["reports"] += 1
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-rows", type=int, default=1024, help="rows per day")
    parser.add_argument("--eval-rows", type=int, default=768)
    parser.add_argument("--corpus-rows", type=int, default=600)
    parser.add_argument("--shard-rows", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--starts", type=int, default=3, help="interpreter start repeats")
    parser.add_argument("--threads", type=int, default=1, help="OMP threads of every job")
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()

    started = time.perf_counter()
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        template, home0 = Path(tmp) / "data", Path(tmp) / "airflow-home"
        generate_data(
            f"file://{template}",
            DAY,
            args.train_rows,
            args.eval_rows,
            args.corpus_rows,
            args.shard_rows,
        )
        bare_dags = Path(tmp) / "bare-dags"
        bare_dags.mkdir()
        (bare_dags / "bare.py").write_text(BARE_DAG)
        home0.mkdir()

        def env_for(home: Path, root: str, switch: str) -> dict[str, str]:
            env = bench_env(
                args.threads,
                {
                    "AIRFLOW_HOME": str(home),
                    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                    "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
                    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
                    "EMBEDFRESH_ARTIFACT_ROOT": root,
                    "EMBEDFRESH_FORK_SERVER": switch,
                },
            )
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
            return env

        t0 = time.perf_counter()
        subprocess.run(
            [AIRFLOW, "db", "migrate"], env=env_for(home0, "file:///unused", "0"), cwd=ROOT,
            check=True, capture_output=True,
        )  # fmt: skip
        migrate_s = time.perf_counter() - t0

        for i, (variant, switch) in enumerate([*VARIANTS.items(), ("bare", "0")]):
            home = Path(tmp) / f"home-{i}"
            shutil.copytree(home0, home)
            artifacts = Path(tmp) / f"artifacts-{i}"
            shutil.copytree(template, artifacts)
            root = f"file://{artifacts}"
            env = env_for(home, root, switch)
            if variant == "bare":
                env["AIRFLOW__CORE__DAGS_FOLDER"] = str(bare_dags)  # dag.test() serializes it
                facts, bare_s = dag_test(env, root, bare_dags, "bench_bare_task", args.epochs)
                runs[variant] = {"facts": facts, "demo_s": bare_s}
                continue
            facts, demo_s = dag_test(env, root, ROOT / "dags", DAG_ID, args.epochs)
            walls = job_walls(artifacts / "runs" / "tiny" / facts["run_id"] / "reports")
            runs[variant] = {"facts": facts, "demo_s": demo_s, "tasks": per_task(facts, walls)}
        starts = start_costs(args.starts, env_for(home0, "file:///unused", "0"))

    bare = runs["bare"]
    assert len(bare["facts"]["tasks"]) == TASK_INSTANCES, bare["facts"]["tasks"]
    bare_tasks = sorted(bare["facts"]["tasks"], key=lambda t: t[3])
    bare_task_s = median([t_end - t_start for *_, t_start, t_end in bare_tasks[1:]])
    bare_first_s = bare_tasks[0][4] - bare_tasks[0][3]
    bare_s = bare["demo_s"]
    start_med = {k: median(v["seconds"]) for k, v in starts.items()}
    split_rows, task_rows, bullets_runs = [], {}, []
    for variant in VARIANTS:
        run, facts = runs[variant], runs[variant]["facts"]
        tasks, demo_s = run["tasks"], run["demo_s"]
        jobs_s = sum(t["job_s"] for t in tasks.values())
        tasks_s = sum(t["task_s"] for t in tasks.values())
        n_tasks = sum(t["n"] for t in tasks.values())
        startup_s = facts["parsed"] - facts["spawned"]
        test_s = facts["tested"] - facts["parsed"]
        overhead = demo_s - jobs_s
        # Outside its job's clock, per task instance of a task that runs a job.
        outside = [
            (t["task_s"] - t["job_s"]) / t["n"] for k, t in tasks.items() if k in TASK_MODULES
        ]
        run.update(
            overhead=overhead / demo_s, outside=median(outside), jobs_s=jobs_s,
            own=(overhead - bare_s) / demo_s,
        )  # fmt: skip
        split_rows += [
            [variant, "demo wall time (dag.test() interpreter, spawn to exit)", f"{demo_s:.1f}", "100%"],
            [variant, "jobs' own wall time (sum of report wall_seconds)", f"{jobs_s:.1f}", f"{jobs_s / demo_s:.0%}"],
            [variant, "**overhead** (demo - jobs)", f"{overhead:.1f}", f"{overhead / demo_s:.0%}"],
            [variant, "- Airflow's own: a bare DAG of the same shape, spawn to exit", f"{bare_s:.1f}", f"{bare_s / demo_s:.0%}"],
            [variant, "- the project's: overhead - Airflow's own", f"{overhead - bare_s:.1f}", f"{(overhead - bare_s) / demo_s:.0%}"],
            [variant, "- Airflow start-up: interpreter, imports, DagBag parse", f"{startup_s:.1f}", f"{startup_s / demo_s:.0%}"],
            [variant, "- dag.test() outside task instances (scheduling loop, DB)", f"{test_s - tasks_s:.1f}", f"{(test_s - tasks_s) / demo_s:.0%}"],
            [variant, "- inside task instances, outside the jobs' clocks", f"{tasks_s - jobs_s:.1f}", f"{(tasks_s - jobs_s) / demo_s:.0%}"],
        ]  # fmt: skip
        for k in sorted(tasks, key=lambda k: min(x[3] for x in facts["tasks"] if x[0] == k)):
            t = tasks[k]
            row = task_rows.setdefault(k, [k, t["n"]])
            row += [
                f"{t['task_s']:.1f}",
                f"{t['job_s']:.1f}" if t["reports"] else "-",
                f"{t['task_s'] - t['job_s']:.1f}",
            ]
        bullets_runs.append(
            f"{variant}: run {facts['run_id']}, {n_tasks} task instances, all successful; "
            f"overhead {overhead / demo_s:.0%} of {demo_s:.1f} s; a job's task instance spends "
            f"{median(outside):.2f} s outside its job's clock (median over the tasks that run a job)"
        )
    fork, fresh = runs["fork server"], runs["fresh interpreter"]
    start_rows = [
        [
            k,
            f"{start_med[k]:.2f}",
            {None: "", True: "yes", False: "no"}[v["torch"]],
            str([round(x, 2) for x in v["seconds"]]),
        ]
        for k, v in starts.items()
    ]
    bullets = [
        f"Command: `{command_line()}`",
        f"Machine: {machine()}; jobs run with OMP_NUM_THREADS={args.threads}",
        f"Date: {dt.datetime.now(dt.UTC).isoformat(timespec='minutes')}; {NOISY}",
        f"Each variant: one `dag.test()` of `{DAG_ID}` (one daily interval, tiny, cpu, "
        f"{args.epochs} epochs of {args.train_rows} rows, {args.corpus_rows}-row corpus in "
        f"{args.shard_rows}-row shards) in a fresh interpreter, its own copy of the data and "
        "of a migrated AIRFLOW_HOME, one after the other in this run",
        *bullets_runs,
        f"A bare `PythonOperator` task (`bench_bare_task`: the demo's shape, {TASK_INSTANCES} "
        f"task instances of `lambda: None`, `dag.test()` on the same Airflow): {bare_task_s:.2f} s "
        f"median task instance after the first; the first took {bare_first_s:.1f} s (`dag.test()` "
        "starts Airflow's in-process execution API on its first task, whatever the task); "
        f"the whole bare run {bare_s:.1f} s, spawn to exit",
        f"Goal: a job's task outside its job's clock <= a bare task + 1 s "
        f"({bare_task_s + 1:.2f} s): {'met' if fork['outside'] <= bare_task_s + 1 else 'missed'} "
        f"with the fork server ({fork['outside']:.2f} s; fresh interpreter "
        f"{fresh['outside']:.2f} s)",
        f"Goal: demo overhead <= 25%: {'met' if fork['overhead'] <= 0.25 else 'missed'} "
        f"({fork['overhead']:.0%} with the fork server, {fresh['overhead']:.0%} without; "
        f"{TARGET:.0%} was the earlier target). Airflow's own floor: with the demo's "
        f"{fork['jobs_s']:.1f} s of jobs and the bare run's {bare_s:.1f} s, no project's tasks "
        f"could show less than {bare_s / (bare_s + fork['jobs_s']):.0%} on this `dag.test()`; "
        f"the project's own share is {fork['own']:.0%} with the fork server "
        f"({fresh['own']:.0%} without)",
        f"`airflow db migrate` (SQLite, apart: once per demo home): {migrate_s:.1f} s",
        "Tasks whose job writes no report (release, verify) or runs in the worker "
        "(list_shards) count as all overhead",
        f"Wall time of the whole benchmark: {time.perf_counter() - started:.0f} s",
    ]
    variants = list(VARIANTS)
    body = [
        table(["variant", "where the demo's time goes", "s", "share"], split_rows),
        table(
            ["task", "instances"]
            + [f"{h} ({v})" for v in variants for h in ("task s", "job s", "task - job s")],
            list(task_rows.values()),
        ),
        f"Start costs in a fresh interpreter, {args.starts} interleaved repeats:",
        table(["fresh interpreter runs", "median s", "pulls torch", "repeats"], start_rows),
    ]
    publish(
        section(
            "Pipeline overhead: demo DAG run vs its jobs, fork server off and on", bullets, body
        ),
        None if args.no_append else BENCHMARKS,
    )


if __name__ == "__main__":
    main()
