"""Plant defects one at a time in a source tree and run the tests that must catch each
(issue 46: the trimmed suite still catches what the removed or merged tests caught).

A defect is one exact replacement in one product file; the file is always restored. A
defect counts as caught when pytest exits 1 (a test failed or errored), not 2-5 (a
usage or collection problem, nothing collected). ``--side old`` runs the tests of
94a339a that the trimming removed or merged; ``--side new`` the trimmed suite's.

    git -C /work/main worktree add /tmp/defects-old 94a339a
    rsync -a --exclude .venv --exclude artifacts --exclude airflow-home --exclude .git \\
        /work/main/ /tmp/defects-new/
    # each tree imports its own operators/ and plugins/ (the editable install maps
    # embedfresh.operators to /work/main/operators):
    ln -s ../operators TREE/embedfresh/operators; ln -s ../plugins TREE/embedfresh/plugins
    .venv/bin/python scripts/plant_defects.py --tree /tmp/defects-old --side old --json old.json
    .venv/bin/python scripts/plant_defects.py --tree /tmp/defects-new --side new --json new.json

``--check`` only checks that every defect applies exactly once to the tree; ``--tests``
runs other node ids than the table's (with ``--only``). The S3 matrix's sample seed is
``EMBEDFRESH_FAULT_SAMPLE_SEED`` when set, else ``plant-defects``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PYTHON = sys.executable
S3 = "tests/reliability/test_fault_points_s3.py::"
S3_OLD = S3 + "test_every_write_on_s3_killed_then_a_plain_rerun_finishes_the_same"
S3_NEW = S3 + "test_writes_on_s3_killed_then_a_plain_rerun_finishes_the_same"
FILE_MATRIX = (
    "tests/reliability/test_fault_points.py::"
    "test_every_write_killed_then_a_plain_rerun_finishes_the_same"
)
DAG = "tests/test_dags.py::test_dag_runs_to_success_and_does_its_job"
REFRESH = f"{DAG}[dags/embedding_model_refresh.py]"
BATCH = "tests/test_refresh_on_batch.py::test_the_refresh_on_aws_batch_does_what_the_local_run_does"
COMPILE = "tests/test_compile_job.py::test_cpu_compile_stores_restores_and_hits"
COMPILE_DDP = "tests/test_compile_ddp.py::"
DDP = "tests/test_train_ddp.py::test_two_ranks_match_one_process_with_the_global_batch"
FSDP = "tests/test_train_fsdp.py::test_fsdp_trains_what_ddp_trains_holding_half_of_it_per_rank"
HOSTS = "tests/test_multinode_netns.py::test_two_hosts_train_bit_exact_against_one_host"
TRIGGERS = (
    "tests/airflow/test_triggers.py::test_every_dag_runs_to_success_triggered_with_its_defaults"
)
LEDGER = "SELECT shard, sha256, rows FROM embedfresh.loaded_shards WHERE table_name"


@dataclass(frozen=True)
class Defect:
    """``old`` replaced by ``new`` in ``path``; the tests that must fail on each side."""

    name: str
    path: str
    old: str
    new: str
    old_tests: tuple[str, ...]
    new_tests: tuple[str, ...]


# fmt: off
DEFECTS = [
    Defect("index load reads every release's ledger", "embedfresh/core/index/pgvector.py",
           f'"{LEDGER} = %s",\n            (table,),',
           f'"{LEDGER} LIKE %s",\n            (table.rsplit("_", 1)[0] + "_%",),',
           (f"{S3_OLD}[index_load]",), (f"{S3_NEW}[index_load]",)),
    Defect("array child ignores its index", "embedfresh/core/config/embedding.py",
           'os.environ.get("AWS_BATCH_JOB_ARRAY_INDEX", "")',
           'os.environ.get("AWS_BATCH_ARRAY_INDEX", "")',
           (BATCH,), (BATCH,)),
    Defect("compile key ignores the launch's world size", "embedfresh/ml/compile/key.py",
           "        world_size = launch_world_size()\n", "        world_size = 1\n",
           (COMPILE_DDP + "test_two_process_compile_then_ddp_train_hits",),
           (COMPILE_DDP + "test_two_process_compile_stores_one_entry_under_a_key_of_world_size_2",
            COMPILE_DDP + "test_a_one_process_train_looks_up_the_one_process_entry")),
    Defect("compile trial trains in the real store", "embedfresh/jobs/compile.py",
           "        artifact_root=trial_store.root,\n", "        artifact_root=store.root,\n",
           (COMPILE,), (COMPILE,)),
    Defect("DDP ranks read overlapping batches", "embedfresh/ml/training/data.py",
           "start = (position * self.world_size + self.rank) * self.batch_size",
           "start = (position + self.rank) * self.batch_size",
           (DDP,), (DDP,)),
    Defect("FSDP leaves the root unsharded", "embedfresh/ml/parallel/sharding.py",
           "        fully_shard(model, mesh=mesh, mp_policy=policy)\n", "",
           (FSDP,), (FSDP,)),
    Defect("a killed train leaves its write probe", "embedfresh/ml/training/run.py",
           '    store.write_bytes(probe, b"")\n    store.remove(probe)\n',
           '    if not store.exists(probe):  # an earlier attempt proved it writable\n'
           '        store.write_bytes(probe, b"")\n        store.remove(probe)\n',
           (f"{S3_OLD}[train]",), (f"{FILE_MATRIX}[train]",)),
    Defect("corpus verify reads the Param, not the resolved version", "dags/corpus_embeddings.py",
           '**task_resources("verify", ON_BATCH),\n        version=VERSION,',
           '**task_resources("verify", ON_BATCH),\n        version="{{ params.version }}",',
           (TRIGGERS,), (f"{DAG}[dags/corpus_embeddings.py]",)),
    Defect("embedding-set Asset event drops its rows", "operators/embed.py",
           'extra={k: summary.get(k) for k in ("rows", "manifest")},',
           'extra={"manifest": summary.get("manifest")},',
           (REFRESH,), (REFRESH,)),
    Defect("cost topology ignores LOCAL_WORLD_SIZE", "embedfresh/core/cost.py",
           '    local = int(env.get("LOCAL_WORLD_SIZE", str(world)) or world)\n',
           "    local = world\n",
           (HOSTS,), (HOSTS,)),
]
# fmt: on


def source(tree: Path, defect: Defect) -> str:
    """The file ``defect`` plants in, as it is; exits unless its snippet occurs once."""
    path = tree / defect.path
    text = path.read_text()
    found = text.count(defect.old)
    if found != 1:
        raise SystemExit(f"{defect.name}: the snippet occurs {found} times in {path}")
    return text


def run_tests(tree: Path, side: str, tests: tuple[str, ...], limit: float) -> dict:
    """Run ``tests`` in ``tree`` (its own embedfresh first on the path); what happened."""
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "CI": "true",
        "EMBEDFRESH_TEST_LIMIT_S": "0",  # a slow test must fail for the defect, not the clock
        # The S3 matrix's sample (a checkout without git draws a fixed one otherwise).
        "EMBEDFRESH_FAULT_SAMPLE_SEED": os.environ.get(
            "EMBEDFRESH_FAULT_SAMPLE_SEED", "plant-defects"
        ),
    }
    cmd = [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += [f"--basetemp=/tmp/bt-defects-{side}", "-x", "-n", "0", *tests]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=limit)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = None
    lines = out.strip().splitlines() or [""]
    reason = next((ln for ln in lines if re.match(r"(FAILED|ERROR) ", ln)), lines[-1])
    return {
        "exit": code,
        "caught": code == 1,
        "seconds": round(time.monotonic() - started, 1),
        "reason": reason[:400],
        "tail": out[-4000:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, required=True, help="a checkout to plant in")
    parser.add_argument("--side", choices=("old", "new"), required=True)
    parser.add_argument("--only", action="append", help="a defect's name (repeatable)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--check", action="store_true", help="only check the snippets apply")
    parser.add_argument("--tests", nargs="+", help="run these node ids instead of the table's")
    parser.add_argument("--limit", type=float, default=1500, help="seconds a defect's run may take")
    args = parser.parse_args()
    tree = args.tree.resolve()
    chosen = [d for d in DEFECTS if not args.only or d.name in args.only]
    if args.check:  # read only: the tree may be in use
        for defect in chosen:
            source(tree, defect)
            print(f"applies once: {defect.name} ({defect.path})")
        return
    results = []
    for defect in chosen:
        original = source(tree, defect)
        (tree / defect.path).write_text(original.replace(defect.old, defect.new))
        try:
            tests = args.tests or (defect.old_tests if args.side == "old" else defect.new_tests)
            result = {"defect": defect.name, "path": defect.path, "tests": tests}
            result |= run_tests(tree, args.side, tests, args.limit)
        finally:
            (tree / defect.path).write_text(original)
        results.append(result)
        mark = "yes" if result["caught"] else f"NO (exit {result['exit']})"
        print(f"{defect.name}: caught {mark} in {result['seconds']} s: {result['reason']}")
        sys.stdout.flush()
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    if results:
        print(f"\n| defect | planted in | {args.side} tests | caught | s |\n|---|---|---|---|---:|")
        for r in results:
            tests = "<br>".join(re.sub(r"^(\w+/)+", "", t) for t in r["tests"])
            caught = "yes" if r["caught"] else "**no**"
            print(f"| {r['defect']} | {r['path']} | {tests} | {caught} | {r['seconds']} |")


if __name__ == "__main__":
    main()
