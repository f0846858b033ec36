"""The embedded demo: ``embedding_model_refresh`` through Airflow, day after day.

Generates the data set into a local artifact folder, prepares a project-local Airflow
(``AIRFLOW_HOME=./airflow-home``, SQLite), then runs the DAG with ``dag.test()`` for
consecutive days (two by default, ``--days N`` for more: ``--days 8`` is the week of
docs/GATE.md), each a manual run given its ``day`` Param, each in a fresh interpreter:
health -> compile -> train -> evaluate -> gate -> embed the candidate (one mapped task
per corpus shard) -> verify -> load_index -> search_check -> release, every job a
``python -m embedfresh.jobs.<name>`` process as in production. Each day trains
incrementally from the model production holds. Ends with a short summary: per day the
gate decision and its figures (nDCG@10 of the judged queries with its interval, how
many queries decided it), the search check's and the release, then the live release
with its vector index (the embedded PostgreSQL + pgvector under the artifact root) and a
query searched through ``python -m embedfresh.jobs.search``, compute-hours and the
estimated cost; with ``--figures FILE``, the same per day as JSON. Run it with ``make
demo``; ``make airflow`` then shows the same runs in the web UI (same AIRFLOW_HOME and
artifact root), as a scheduler's runs read: real start and end times, and each task's
log where the api-server looks for it.

The corpus is the whole product catalogue (24,000 products) and the generator judges
every product for each of its held-out queries (docs/DATA.md), so search is judged
completely, on nDCG@10 (docs/GATE.md); a run whose gate does not PASS ends green at
``gate``, the live release stays where it was, and the summary says why.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from embedfresh.jobs.generate_data import DEFAULT_JUDGED_QUERIES  # noqa: E402

DAG_ID = "embedding_model_refresh"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"

# Runs in a fresh interpreter per day: one dag.test(), its facts written to a JSON file.
# dag.test() runs each task in this process and logs to the console, and it dates the
# run's start at its logical date (a run of 2026-01-02 "lasted" months). So that the
# runs read in the web UI like a scheduler's: each task try's log goes to the file the
# api-server reads (base_log_folder / log_filename_template, the path a worker writes,
# as JSON lines, the format the supervisor writes), echoed to the console as text, and
# the run's start is set to when it really started.
DAG_RUN = r"""
import datetime as dt, json, sys
from airflow.dag_processing.dagbag import DagBag

folder, dag_id, logical_date, conf, out = sys.argv[1:6]
conf = json.loads(conf)


# A binary stream of JSON log lines: into the running task try's log file, if any, and
# onto stdout as one plain line each.
class TaskLogSink:

    def __init__(self):
        self.file = None

    def write(self, data):
        if self.file is not None:
            self.file.write(data)
        for line in bytes(data).decode(errors="replace").splitlines():
            try:
                event = json.loads(line)
                line = " ".join(str(event.get(k, "")) for k in ("timestamp", "level", "logger", "event"))
            except (ValueError, AttributeError):
                pass
            print(line, flush=True)
        return len(data)

    def flush(self):
        if self.file is not None:
            self.file.flush()


def write_task_logs_to_files():
    import airflow.sdk.definitions.dag as dag_module
    from airflow.sdk._shared.logging import configure_logging
    from airflow.sdk.log import init_log_file, mask_logs
    from airflow.utils.helpers import log_filename_template_renderer

    sink = TaskLogSink()
    configure_logging(json_output=True, log_level="INFO", output=sink,
                      cache_logger_on_first_use=False, extra_processors=(mask_logs,))
    render, run_task = log_filename_template_renderer(), dag_module._run_task

    def run_task_logged(*, ti, task, run_triggerer=False):
        with open(init_log_file(render(ti=ti)), "ab") as sink.file:
            try:
                return run_task(ti=ti, task=task, run_triggerer=run_triggerer)
            finally:
                sink.file.flush()
                sink.file = None

    dag_module._run_task = run_task_logged


bag = DagBag(dag_folder=folder)
if bag.import_errors:
    sys.exit(f"DAG import errors: {bag.import_errors}")
dag = bag.dags[dag_id]
# Airflow 3.3.2's dag.test() fails at run success on a DAG with a Deadline Alert (it
# skips the alert ids the scheduler's copy has); the deadline needs a scheduler anyway.
dag.deadline = None
write_task_logs_to_files()
started = dt.datetime.now(dt.timezone.utc)
run = dag.test(logical_date=dt.datetime.fromisoformat(logical_date), run_conf=conf)

from sqlalchemy import select
from airflow.models import DagRun
from airflow.utils.session import create_session

with create_session() as session:
    dr = session.scalars(select(DagRun).where(DagRun.run_id == run.run_id)).one()
    dr.start_date = started
    if dr.queued_at is None or dr.queued_at > started:
        dr.queued_at = started
    tis = dr.get_task_instances(session=session)
    facts = {"run_id": dr.run_id, "state": str(dr.state),
             "start_date": dr.start_date.isoformat(),
             "end_date": dr.end_date.isoformat() if dr.end_date else None,
             "tasks": sorted([t.task_id, t.map_index, str(t.state)] for t in tis)}
with open(out, "w") as f:
    json.dump(facts, f)
"""


def airflow_env(home: Path, root: str) -> dict[str, str]:
    """The project-local Airflow the demo and ``make airflow`` share."""
    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(home / PASSWORDS_FILE),
        EMBEDFRESH_ARTIFACT_ROOT=root,
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def private_passwords_file(home: Path) -> Path:
    """The simple auth manager's password file in ``home``, created empty with mode 0600
    (or made 0600): Airflow would create it readable by every local user, and it keeps
    the mode of a file that exists. ``make airflow`` (same home) does the same."""
    path = home / PASSWORDS_FILE
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    path.chmod(0o600)
    return path


def run_day(env: dict[str, str], home: Path, day: dt.date, conf: dict) -> dict:
    """``dag.test()`` of a run that trains on ``day``; its log goes to a file."""
    logs = home / "demo-logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path, facts_path = logs / f"{day}.log", logs / f"{day}.json"
    # dag.test() makes a manual run, which never trains on its data interval: the day
    # goes in the conf. The logical date is the one a scheduled run of that day has
    # (its interval's end), so the runs sort by day in the web UI.
    logical = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)
    conf = {**conf, "day": day.isoformat()}
    print(f"demo: {day}: dag.test() of {DAG_ID} (task logs: {log_path})", flush=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                DAG_RUN,
                str(ROOT / "dags"),
                DAG_ID,
                logical.isoformat(),
                json.dumps(conf),
                str(facts_path),
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0 or not facts_path.exists():
        sys.exit(f"demo: dag.test() for {day} crashed (exit {proc.returncode}); see {log_path}")
    facts = json.loads(facts_path.read_text())
    facts["seconds"] = round(time.monotonic() - started, 1)
    states = {}
    for task_id, _, state in facts["tasks"]:
        states.setdefault(task_id, []).append(state)
    print(
        f"demo: {day}: run {facts['state']} in {facts['seconds']} s: "
        + ", ".join(
            f"{t} {s[0]}" if len(s) == 1 else f"{t} x{len(s)} {'/'.join(sorted(set(s)))}"
            for t, s in states.items()
        ),
        flush=True,
    )
    return facts


def day_summary(store, day: dt.date, facts: dict) -> list[str]:
    """Lines for one day, from the run's reports in the artifact store."""
    from embedfresh.core import layout
    from embedfresh.core.cost import read_run_costs, run_cost_total

    run_id = facts["run_id"]

    def report(kind: str) -> dict | None:
        rel = layout.report("tiny", run_id, kind)
        return store.read_json(rel) if store.exists(rel) else None

    train, evaluated, gate = report("train"), report("eval"), report("gate")
    check = report("search-products")
    lines = [f"{day}  (run {run_id}: {facts['state']}, {facts['seconds']} s)"]
    if train:
        init = train.get("init", {})
        start_from = init.get("version") or init.get("weights") or "?"
        line = (
            f"    trained {train.get('steps')} steps from {init.get('source')} ({start_from})"
            f", {train.get('samples_per_second')} samples/s"
        )
        if train.get("compute_hours") is not None:
            line += (
                f"; {train['compute_hours']:.6f} compute-hours, "
                f"estimated ${train.get('estimated_cost_usd', 0):.6f}"
            )
        lines.append(line)
    if evaluated:
        m = evaluated["metrics"]
        lines.append(
            f"    eval ({evaluated['n_queries']} of {evaluated['search']['pool']} judged queries, "
            f"{evaluated['n_examples']} pairs): nDCG@10 {m['ndcg_at_10']:.4f}  recall@100 "
            f"{m['recall_at_100']:.4f}  MRR@10 {m['mrr_at_10']:.4f}; head: accuracy "
            f"{m['accuracy']:.4f}  auc {m['auc']:.4f}"
        )
    if gate:
        looks = gate.get("looks") or []
        lines.append(
            f"    gate: {gate['verdict']} vs {gate['reference']['version']} "
            f"({gate['reference']['source']}), {gate.get('n_queries')} queries in "
            f"{len(looks)} look(s): {gate['reason']}"
        )
        for metric in gate.get("metrics", []):
            d, low, high = metric.get("d"), metric.get("ci_low"), metric.get("ci_high")
            shown = "n/a" if d is None else f"{d:+.3%} [{low:+.3%}, {high:+.3%}]"
            lines.append(f"      {metric['metric']:<13} d {shown}  {metric['verdict']}")
        skipped = gate.get("metrics_not_compared") or {}
        if skipped:
            lines.append(
                f"      not compared: {', '.join(skipped)} ({next(iter(skipped.values()))})"
            )
        if gate["verdict"] == "INCONCLUSIVE":
            lines.append(
                "      (the interval is too wide to decide even over the whole pool: "
                "production stays; a larger pool of judged queries would decide, docs/GATE.md)"
            )
    else:
        lines.append("    gate: not reached (see the task log)")
    if check:
        lines += check_lines(check)
    release = report_release(store, run_id)
    lines.append(f"    release: {release}")
    costs = read_run_costs(store, "tiny", run_id)
    if costs:
        total = run_cost_total(costs)
        lines.append(
            f"    cost: {total['executions']} job executions, {total['attempts']} attempts "
            f"({total['failed_attempts']} failed), {total['seconds']:.1f} s, "
            f"{total['instance_hours']:.6f} instance-hours, estimated "
            f"${total['estimated_cost_usd']:.6f} as {costs[0]['instance_type']}"
        )
    return lines


def check_lines(check: dict) -> list[str]:
    """The search check's figures: the index's faithfulness, nDCG@10 through the index
    and, against the live release, d with its interval."""
    regression = check.get("regression") or {}
    against = regression.get("with") or {}
    versus = f" vs release {against['release']} {against['ndcg_at_10']:.4f}" if against else ""
    lines = [
        f"    search check: {check['verdict']}: ANN recall@10 {check['ann_recall']:.4f} (min "
        f"{check['min_ann_recall']}) at ef_search {check['index']['ann']['ef_search']}, nDCG@10 "
        f"loss {check.get('ndcg_loss') or 0:.3%}; nDCG@10 through the index "
        f"{check['ndcg_at_10']:.4f}"
        f"{versus} ({check['queries_judged']} judged queries; latency p50 "
        f"{check['latency_ms']['p50']} ms, p99 {check['latency_ms']['p99']} ms)"
    ]
    for metric in (regression.get("gate") or {}).get("metrics", []):
        lines.append(
            f"      {metric['metric']:<13} d {metric['d']:+.3%} [{metric['ci_low']:+.3%}, "
            f"{metric['ci_high']:+.3%}]  {metric['verdict']}"
        )
    return [*lines, f"      {check['reason']}"]


def day_figures(store, day: dt.date, facts: dict) -> dict:
    """One day's decisions as data (``--figures``): the gate's and the search check's."""
    from embedfresh.core import layout

    def report(kind: str) -> dict:
        rel = layout.report("tiny", facts["run_id"], kind)
        return store.read_json(rel) if store.exists(rel) else {}

    gate, check = report("gate"), report("search-products")

    def metric(doc: dict, name: str) -> dict:
        found = [m for m in doc.get("metrics", []) if m.get("metric") == name]
        return {k: found[0].get(k) for k in ("d", "ci_low", "ci_high")} if found else {}

    regression = check.get("regression") or {}
    return {
        "day": day.isoformat(),
        "run_id": facts["run_id"],
        "state": facts["state"],
        "seconds": facts["seconds"],
        "gate": gate.get("verdict"),
        "gate_queries": gate.get("n_queries"),
        "gate_looks": len(gate.get("looks") or []),
        "gate_ndcg": metric(gate, "ndcg_at_10"),
        "search_check": check.get("verdict"),
        "search_queries": check.get("queries_judged"),
        "search_ndcg": metric(regression.get("gate") or {}, "ndcg_at_10"),
        "released": store.exists(layout.release("tiny", facts["run_id"])),
    }


def report_release(store, run_id: str) -> str:
    """Whether the run made a release, and what it carries."""
    from embedfresh.core import layout
    from embedfresh.core.releases import read_release

    if not store.exists(layout.release("tiny", run_id)):
        return "none (the live release stays)"
    release = read_release(store, "tiny", run_id)
    tables = ", ".join(f"{c} -> {e.table} ({e.rows} rows)" for c, e in release.corpora.items())
    return f"{release.release} (version {release.version}): {tables}"


def search_once(env: dict[str, str], root: str, query: str) -> list[str]:
    """The search CLI, as a person runs it, on the live release."""
    cmd = [sys.executable, "-m", "embedfresh.jobs.search", "--set", f"artifact_root={root}",
           "--set", f"query={query}", "--set", "k=5"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return [f"search failed (exit {done.returncode}): {done.stderr.strip()[-500:]}"]
    shown = f'python -m embedfresh.jobs.search --set artifact_root={root} --set query="{query}" --set k=5'
    return [f"$ {shown}", *done.stdout.splitlines()[:-1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--root",
        default=str(ROOT / "artifacts" / "demo"),
        help="local folder of the demo's artifact store (emptied first)",
    )
    parser.add_argument(
        "--airflow-home", default=str(ROOT / "airflow-home"), help="project-local AIRFLOW_HOME"
    )
    parser.add_argument("--start", default="2026-01-01", help="first data day")
    parser.add_argument("--train-rows", type=int, default=4000, help="training rows per day")
    parser.add_argument("--eval-rows", type=int, default=10000, help="held-out eval rows")
    parser.add_argument(
        "--corpus-rows", type=int, default=24000, help="the whole catalogue: every eval product"
    )
    parser.add_argument("--corpus-shard-rows", type=int, default=6000)
    parser.add_argument(
        "--judged-queries",
        type=int,
        default=DEFAULT_JUDGED_QUERIES,
        help="held-out queries judged against the whole corpus",
    )
    parser.add_argument("--days", type=int, default=2, help="consecutive days refreshed")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--figures", help="write each day's decisions to this JSON file")
    args = parser.parse_args()

    folder = Path(args.root).resolve()
    home = Path(args.airflow_home).resolve()
    if folder.exists():
        print(f"demo: emptying the demo store {folder}")
        shutil.rmtree(folder)
    root = f"file://{folder}"
    start = dt.date.fromisoformat(args.start)

    from embedfresh.core.storage import ArtifactStore
    from embedfresh.ml.data.generate import write_dataset
    from embedfresh.operators.resources import pool_command

    store = ArtifactStore(root)
    generated = write_dataset(
        store,
        "products",
        0,
        start,
        args.days,
        args.train_rows,
        args.eval_rows,
        "products",
        args.corpus_rows,
        args.corpus_shard_rows,
        args.judged_queries,
    )
    print(
        f"demo: generated {generated['train_rows']} training rows over {args.days} days, "
        f"{args.eval_rows} eval rows, {generated['judgments']['queries']} judged queries, a "
        f"corpus of {args.corpus_rows} products"
    )

    home.mkdir(parents=True, exist_ok=True)
    private_passwords_file(home)
    env = airflow_env(home, root)
    airflow = str(Path(sys.executable).with_name("airflow"))
    print(f"demo: airflow db migrate (AIRFLOW_HOME={home})", flush=True)
    migrate = subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, text=True)
    if migrate.returncode != 0:
        sys.exit(f"demo: airflow db migrate failed:\n{migrate.stderr[-3000:]}")
    # The pool the DAGs' device steps take: `make airflow` on this home schedules them.
    command = pool_command()
    if command is not None:
        pool = subprocess.run([airflow, *command[1:]], env=env, capture_output=True, text=True)
        if pool.returncode != 0:
            sys.exit(f"demo: {' '.join(command[:4])} failed:\n{pool.stderr[-3000:]}")

    conf = {"artifact_root": root, "model": "tiny", "backend": "cpu", "epochs": args.epochs}
    days = [start + dt.timedelta(days=i) for i in range(args.days)]
    results = [(day, run_day(env, home, day, conf)) for day in days]

    print("\n=== embedded demo: summary ===")
    for day, facts in results:
        print("\n".join(day_summary(store, day, facts)))
    if args.figures:
        figures = [day_figures(store, day, facts) for day, facts in results]
        Path(args.figures).write_text(json.dumps(figures, indent=2) + "\n")
    from embedfresh.core.releases import live_release

    live = live_release(store, "tiny")
    production = live.version if live else None
    print(
        f"production: tiny {production}, release {live.release if live else None}  "
        f"(registry {store.url('models/tiny/registry.json')})"
    )
    if live and live.corpora:
        entry = live.corpus("products")
        print(f"embeddings: {entry.manifest}")
        print(f"index:      {entry.index['location']}: table {entry.table}, live view "
              f"embedfresh.{entry.index['live_view']}")  # fmt: skip
        print("\n".join(search_once(env, root, "pilates mat")))
    else:
        print("embeddings: none released")
    print(f"reports:    {store.url('runs/tiny')}/<run id>/reports/")
    print(f"airflow:    {home} (make airflow shows these runs in the web UI)")


if __name__ == "__main__":
    main()
