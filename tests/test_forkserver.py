"""The local runner's fast start: jobs forked from a server with torch imported
(``embedfresh/jobs/forkserver.py``, ``operators/runners/forkserver.py``).

A forked job must be what ``python -m`` would have started (argv, environment, working
directory, ``sys.path[0]``, a session of its own, exit code, streams), only started
from a process that has its imports done; a crash or a kill of the job never reaches
the server; a changed file or variable gets another server, never a stale one; and a
server that cannot start leaves the job to a fresh interpreter, said in the log.

Every test starts its own servers (a variable private to the test is part of their
key) and ends them at its end. The job is ``tests/forkserver_job.py``.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from embedfresh.operators.runners import forkserver
from embedfresh.operators.runners.local import LocalRunner
from tests.conftest import ROOT, job_env

JOB = [sys.executable, "-m", "tests.forkserver_job"]


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The job's environment, with a variable of this test's own (so its servers are its
    own); the test job's module is forkable; every server of the test ended after it.
    A server may take its time to start (it imports torch; CI's box is busy): these tests
    are about what a forked job is, not how fast a server listens."""
    monkeypatch.setattr(forkserver, "FORKABLE", ("embedfresh.jobs.", "tests.forkserver_job"))
    monkeypatch.setattr(forkserver, "START_TIMEOUT_S", 600.0)
    env = job_env({"FORK_TEST_KEY": secrets.token_hex(8)})
    env.pop(forkserver.ENV_SWITCH, None)
    yield env
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = proc.info["cmdline"] or []
            environ = proc.info["environ"] or {}
        except psutil.Error:
            continue
        if (
            forkserver.SERVER_MODULE in cmdline
            and environ.get("FORK_TEST_KEY") == env["FORK_TEST_KEY"]
        ):
            proc.terminate()  # an idle server ends on SIGTERM and removes its socket
            try:
                proc.wait(10)
            except psutil.TimeoutExpired:
                proc.kill()


def run(
    argv: list[str], env: dict[str, str], cwd: Path = ROOT, **extra: str
) -> tuple[int, list[str], dict | None]:
    """The job through the local runner: its exit code, the log lines, its summary."""
    handler = Lines()
    log = logging.getLogger(f"forkserver-test-{secrets.token_hex(4)}")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    runner = LocalRunner(cwd=str(cwd))
    result = runner.run_command(argv, {**env, **extra}, log)
    return result.exit_code, handler.lines, result.summary


def server_of(facts: dict) -> psutil.Process:
    return psutil.Process(facts["parent"])


def test_a_forked_job_is_what_python_m_would_start_with_its_imports_done(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
):
    argv = [*JOB, "describe", "an argument with spaces", "--set", "x=1"]
    code, lines, forked = run(argv, env, FORK_TEST_VARIABLE="forked", FORK_TEST_EXIT="3")
    assert code == 3
    assert any("forked by the fork server" in line for line in lines), lines
    assert {"from the job", "to stderr"} <= set(lines)

    spawned_env = {**env, forkserver.ENV_SWITCH: "0"}
    code, lines, spawned = run(argv, spawned_env, FORK_TEST_VARIABLE="forked", FORK_TEST_EXIT="3")
    assert code == 3 and not any("fork server" in line for line in lines)

    same = ("argv", "name", "cwd", "path0", "variable", "session_leader")
    assert {k: forked[k] for k in same} == {k: spawned[k] for k in same}
    assert forked["argv"] == ["describe", "an argument with spaces", "--set", "x=1"]
    assert forked["name"] == "__main__" and forked["session_leader"] is True
    assert forked["path0"] == str(ROOT)
    # The difference: torch was imported before the forked job's first line ran, and
    # its parent is the fork server, not the runner.
    assert forked["torch_before"] is True and spawned["torch_before"] is False
    assert forkserver.SERVER_MODULE in server_of(forked).cmdline()
    # It forks holding no thread but its own (one BLAS thread, as job_env sets).
    assert server_of(forked).num_threads() == 1
    assert spawned["parent"] == os.getpid()


def test_the_next_job_reuses_the_server_and_its_working_directory_is_its_own(
    env: dict[str, str], tmp_path: Path
):
    _, _, first = run([*JOB, "describe"], env)
    _, _, second = run([*JOB, "describe"], env)
    assert first["parent"] == second["parent"] and first["pid"] != second["pid"]
    # Another working directory is another server (``-m`` resolves modules from it).
    other = tmp_path / "checkout"
    shutil.copytree(ROOT / "tests", other / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    _, _, moved = run([*JOB, "describe"], env, cwd=other)
    assert moved["cwd"] == str(other) and moved["path0"] == str(other)
    assert moved["parent"] != first["parent"]


def test_a_crashing_job_never_takes_the_server_down(env: dict[str, str]):
    _, _, before = run([*JOB, "describe"], env)
    code, lines, _ = run([*JOB, "crash"], env)
    assert code == -signal.SIGSEGV, lines
    _, _, after = run([*JOB, "describe"], env)
    assert after["parent"] == before["parent"]
    assert server_of(after).is_running()


#: How a job ends (action, its $FORK_TEST_EXIT), the status the runner gets and what must
#: come out of it: the same forked and fresh.
ENDINGS = {
    "finish": ("finish", "5", 5, ["atexit handler ran", "a log record on the way out",
                                  "unflushed python output", "unflushed C output"]),
    "raise": ("raise", "0", 1, ["ValueError: an uncaught error"]),
    "interrupt": ("interrupt", "0", -signal.SIGINT, ["KeyboardInterrupt"]),
    "exit-message": ("exit-message", "0", 1, ["a message"]),
    "exit-minus-one": ("exit", "-1", 255, []),
    "exit-256": ("exit", "256", 0, []),
}  # fmt: skip


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_forked_job_ends_as_a_fresh_interpreter_would(
    env: dict[str, str], tmp_path: Path, ending: str
):
    """The forked job skips the interpreter's finalisation (embedfresh/jobs/forkserver.py,
    ``end_job``), nothing a job's output or status depends on: its threads are joined,
    its atexit handlers and logging's flush run, Python's and C's buffered output reach
    the log, and its exit status and traceback are a fresh interpreter's."""
    action, exit_env, code, expected = ENDINGS[ending]
    for switch in ("1", "0"):
        written = tmp_path / f"thread-{switch}.txt"
        got, lines, _ = run(
            [*JOB, action, str(written)],
            {**env, forkserver.ENV_SWITCH: switch},
            FORK_TEST_EXIT=exit_env,
        )
        forked = any("forked by the fork server" in line for line in lines)
        assert forked == (switch == "1"), lines
        assert got == code, (switch, lines)
        for line in expected:
            assert any(line in seen for seen in lines), (switch, line, lines)
        if ending == "finish":  # the non-daemon thread finished before the job ended
            assert written.read_text() == "written by a non-daemon thread"


def test_kill_ends_the_forked_job_and_its_children_and_the_server_stays(
    env: dict[str, str], tmp_path: Path
):
    pids_file = tmp_path / "pids.json"
    runner = LocalRunner(cwd=str(ROOT), kill_grace_s=2)
    results = []
    thread = threading.Thread(
        target=lambda: results.append(
            runner.run_command([*JOB, "grandchild", str(pids_file)], env, logging.getLogger("k"))
        ),
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 60
    while not (pids_file.exists() and pids_file.read_text()):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.02)
    job, grandchild = json.loads(pids_file.read_text())
    server = psutil.Process(psutil.Process(job).ppid())
    assert forkserver.SERVER_MODULE in server.cmdline()  # forked, not spawned
    runner.kill()
    thread.join(15)
    assert not thread.is_alive()
    assert results[0].exit_code == -signal.SIGTERM
    for pid in (job, grandchild):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    assert server.is_running()
    after = runner.run_command([*JOB, "describe"], env, logging.getLogger("k"))
    assert after.exit_code == 0 and after.summary["parent"] == server.pid


def test_the_key_follows_the_code_and_the_environment_but_not_airflows_per_task_variables(
    tmp_path: Path,
):
    checkout = tmp_path / "checkout"
    shutil.copytree(
        ROOT / "embedfresh", checkout / "embedfresh", ignore=shutil.ignore_patterns("__pycache__")
    )
    cwd = str(checkout)
    env = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1"}
    key = forkserver.server_key(env, cwd)
    assert forkserver.server_key(env, cwd) == key
    # Airflow's own variables differ per task and are never read by the data plane.
    task = {
        **env,
        "AIRFLOW_CTX_DAG_RUN_ID": "r2",
        "_AIRFLOW__STARTUP_MSG": "{}",
        "__AIRFLOW_SUPERVISOR_FD": "12",
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
    }
    assert forkserver.server_key(task, cwd) == key
    assert forkserver.server_key({**env, "OMP_NUM_THREADS": "2"}, cwd) != key
    assert forkserver.server_key({**env, "HEALTH_FAULT": "matmul"}, cwd) != key
    source = checkout / "embedfresh/ml/training/loop.py"
    source.write_text(source.read_text() + "\n# changed\n")
    assert forkserver.server_key(env, cwd) != key


def test_a_server_that_cannot_start_leaves_the_job_to_a_fresh_interpreter(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(forkserver, "SERVER_MODULE", "embedfresh.jobs.no_such_server")
    code, lines, facts = run([*JOB, "describe"], env)
    assert code == 0 and facts["torch_before"] is False
    assert any("Fork server unavailable" in line and "fresh interpreter" in line for line in lines)


def test_a_server_that_yields_to_one_closing_down_is_followed_by_one_that_listens(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
):
    # A server that finds the socket of one closing down exits 0 (EADDRINUSE) and the
    # other removes its socket as it goes: the client starts another, the job is forked.
    spawn, spawned = forkserver._spawn, []

    def first_yields(path: str, server_env: dict[str, str], cwd: str) -> subprocess.Popen:
        spawned.append(path)
        if len(spawned) == 1:
            return subprocess.Popen([sys.executable, "-c", "pass"])
        return spawn(path, server_env, cwd)

    monkeypatch.setattr(forkserver, "_spawn", first_yields)
    code, lines, facts = run([*JOB, "describe"], env)
    assert code == 0 and facts["torch_before"] is True, lines
    assert len(spawned) >= 2 and not any("unavailable" in line for line in lines)


def test_only_the_projects_jobs_under_this_interpreter_are_forked():
    python = sys.executable
    assert forkserver.module_command([python, "-m", "embedfresh.jobs.train"], python)
    assert not forkserver.module_command([python, "-m", "embedfresh.jobs.launch"], python)
    assert not forkserver.module_command([python, "-c", "pass"], python)
    assert not forkserver.module_command(["/opt/py", "-m", "embedfresh.jobs.train"], "/opt/py")
    assert not forkserver.enabled({forkserver.ENV_SWITCH: "0"})
    assert forkserver.enabled({})


def test_a_teams_own_model_embeds_byte_equal_forked_and_fresh_and_a_killed_run_finishes(
    env: dict[str, str], tmp_path: Path
):
    """As a team runs it: its own model (own tokenizer, 384 tokens), long texts in eight
    scripts with string ids, published and embedded through the local runner with the fork
    server off and on; the forked embed is SIGKILLed after its first shard commits and a
    plain re-run finishes the rest. The parts are byte-equal to the fresh interpreter's."""
    import hashlib
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from embedfresh.core import layout
    from embedfresh.core.storage import ArtifactStore
    from tests.own_model import CORPUS, build_own_model

    model_dir = build_own_model(tmp_path / "acme-model")
    texts = [" ".join(CORPUS[i % 8 :] + CORPUS[: i % 8]) * (1 + i % 6) for i in range(120)]
    ids = [f"acme-{hashlib.md5(f'{i}{t}'.encode()).hexdigest()[:12]}" for i, t in enumerate(texts)]
    out = layout.embeddings("acme", "base", "catalogue")
    parts: dict[str, dict[str, str]] = {}
    for switch in ("0", "1"):
        root = f"file://{tmp_path / f'store-{switch}'}"
        store = ArtifactStore(root)
        for s in range(4):
            sink = io.BytesIO()
            rows = slice(s * 30, (s + 1) * 30)
            pq.write_table(pa.table({"id": ids[rows], "text": texts[rows]}), sink)
            store.write_bytes(
                f"{layout.corpus('catalogue')}/{layout.part_name(s)}", sink.getvalue()
            )
        job = {**env, forkserver.ENV_SWITCH: switch}
        common = ["--set", f"artifact_root={root}", "--set", "model=acme"]
        publish = [sys.executable, "-m", "embedfresh.jobs.publish_model", *common]
        code, lines, _ = run([*publish, "--set", f"source={model_dir}"], job)
        assert code == 0, lines[-5:]
        embed = [sys.executable, "-m", "embedfresh.jobs.embed", *common]
        embed += ["--set", "version=base", "--set", "corpus=catalogue", "--set", "run_id=manual"]
        if switch == "1":
            runner = LocalRunner(cwd=str(ROOT))
            thread = threading.Thread(
                target=runner.run_command, args=(embed, job, logging.getLogger("kill")), daemon=True
            )
            thread.start()
            first = Path(root.removeprefix("file://")) / out / "part-00000.COMMIT"
            deadline = time.monotonic() + 120
            while not first.exists():
                assert time.monotonic() < deadline, "the first shard never committed"
                time.sleep(0.005)
            assert isinstance(runner._proc, forkserver.ForkedJob)
            os.killpg(runner._proc.pid, signal.SIGKILL)
            thread.join(30)
        code, lines, summary = run(embed, job)
        assert code == 0, lines[-5:]
        if switch == "1":
            assert 0 in summary["shards_skipped"] and summary["shards_done"], summary
        names = sorted(n for n in store.listdir(out) if n.endswith(".parquet"))
        parts[switch] = {
            n: hashlib.sha256(store.read_bytes(f"{out}/{n}")).hexdigest() for n in names
        }
        table = pa.concat_tables(
            pq.read_table(io.BytesIO(store.read_bytes(f"{out}/{n}"))) for n in names
        )
        assert table.schema.field("id").type == pa.string()
        assert sorted(table["id"].to_pylist()) == sorted(ids)
    assert len(parts["1"]) == 4 and parts["0"] == parts["1"]
