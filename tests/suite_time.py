"""The suite's time budget (docs/BENCHMARKS.md, "The test suite"): the order in which
files reach the two pytest-xdist workers, and the limit on a single test.

- **Order.** ``make test`` runs ``--dist loadfile --no-loadscope-reorder``: a file is
  one unit of work, handed out in collection order to whichever worker is free. xdist's
  own order (files with the most tests first) leaves the few-test, minutes-long files
  for the end, where one worker runs them while the other idles. Here the files known
  to be slow go first, longest first (the longest-processing-time rule), and the many
  short files fill the gaps at the end.
- **Limit.** A test whose call takes longer than :data:`LIMIT_S` fails, naming itself,
  unless :data:`EXCEPTIONS` lists it with its time and reason. Its setup may take twice
  that: a module's or session's fixture (a server, a reference run) is built once, in
  the setup of the first test that asks for it, for all the tests that read it.
  ``EMBEDFRESH_TEST_LIMIT_S`` moves the limit (0 turns the check off, for a profile).
"""

from __future__ import annotations

import os

import pytest

#: Seconds a test's call may take; its setup may take twice as long.
LIMIT_S = float(os.environ.get("EMBEDFRESH_TEST_LIMIT_S", "120"))
SETUP_FACTOR = 2

#: The deliberate exceptions (at most three): node id and phase -> measured time, reason.
#: Times: quiet / beside other work on the 2-core box (docs/BENCHMARKS.md, 2026-12-06).
EXCEPTIONS: dict[tuple[str, str], str] = {
    (
        "tests/stack/test_celery_stack.py::test_refresh_runs_on_postgres_and_two_celery_workers",
        "setup",
    ): (
        "217 s / 266-272 s: the Postgres + Redis + two-worker stack starts, then the one "
        "refresh with a worker killed in train and one in embed, which both tests read"
    ),
    ("tests/test_demo.py::test_demo_runs_the_dag_day_after_day_and_every_day_decides", "call"): (
        "100 s / 138 s: the README's `make demo` driver, three days of the refresh end to "
        "end through dag.test(), each day decided (issue 45)"
    ),
    (
        "tests/airflow/test_ui_browser.py::test_trigger_with_defaults_then_the_page_says_why",
        "call",
    ): (
        "107 s / 107 s: two refreshes under the real scheduler, the first triggered from "
        "the web UI's form, the second on a bad partition the gate refuses, read on the page"
    ),
}

#: Seconds each slow file takes on one worker of the 2-core box (setup and calls added
#: up, from a full run's durations: scripts/suite_profile.py; docs/BENCHMARKS.md, 2026-12-07);
#: files not listed are short.
FILE_SECONDS: dict[str, float] = {
    "tests/stack/test_celery_stack.py": 265,
    "tests/reliability/test_fault_points.py": 262,
    "tests/reliability/test_fault_points_s3.py": 257,
    "tests/test_dags.py": 207,
    "tests/airflow/test_triggers.py": 203,
    "tests/test_embed_fast_modes.py": 159,
    "tests/airflow/test_ui_browser.py": 124,
    "tests/test_release_index.py": 121,
    "tests/test_compile_ddp.py": 118,
    "tests/test_refresh_on_batch.py": 114,
    "tests/test_demo.py": 108,
    "tests/test_team_data.py": 90,
    "tests/test_train_fsdp.py": 106,
    "tests/test_own_model.py": 105,
    "tests/reliability/test_sigkill_resume.py": 104,
    "tests/test_multinode_netns.py": 97,
    "tests/airflow/test_batch_airflow.py": 97,
    "tests/test_xla_backend.py": 92,
    "tests/test_embed_array.py": 84,
    "tests/airflow/test_train_retry_resume.py": 76,
    "tests/reliability/test_s3_faults.py": 74,
    "tests/test_parity.py": 65,
    "tests/test_docs_commands.py": 62,
    "tests/test_compile_job.py": 59,
    "tests/reliability/test_fault_points_sharded.py": 54,
    "tests/test_registry.py": 54,
    "tests/test_embed_scale.py": 53,
    "tests/test_decoder_embedders.py": 51,
    "tests/test_corpus_sync.py": 50,
    "tests/airflow/test_gate_failure.py": 49,
    "tests/test_health_job.py": 40,
}


#: Files that share a session's expensive fixture run on one worker, as one unit of work:
#: a group's name -> its files (or a folder, ending in "/").
GROUPS: dict[str, tuple[str, ...]] = {
    # One Airflow server (tests/airflow/conftest.py), its demo store and refreshes.
    "airflow": ("tests/airflow/",),
    # The golden run: the refresh under dag.test() once, read by both (tests/golden.py).
    "golden": ("tests/test_dags.py", "tests/test_refresh_on_batch.py"),
    # The shared 2-rank DDP run the sharded tests compare against (tests/sharded.py).
    "ddp_reference": (
        "tests/test_train_ddp.py",
        "tests/test_train_fsdp.py",
        "tests/test_multinode_netns.py",
    ),
    # One cpu compile's cache, read by both compile files (tests/compile_cache.py).
    "compile_cache": ("tests/test_compile_job.py", "tests/test_compile_ddp.py"),
}


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its group's name, else its file."""
    path = nodeid.split("::", 1)[0]
    for name, members in GROUPS.items():
        if any(path == m or (m.endswith("/") and path.startswith(m)) for m in members):
            return name
    return path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow units first, longest first; the rest keep their order (both workers
    collect the same order, as xdist requires)."""
    seconds: dict[str, float] = {}
    for path, s in FILE_SECONDS.items():
        seconds[unit_of(path)] = seconds.get(unit_of(path), 0) + s
    items.sort(key=lambda item: -seconds.get(unit_of(item.nodeid), 0))


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's file-by-file scheduling, with :data:`GROUPS` as one unit each."""
    from xdist.scheduler import LoadFileScheduling

    class GroupedFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return GroupedFiles(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if (
        LIMIT_S > 0
        and report.when in ("setup", "call")
        and report.passed
        and report.duration > (limit := LIMIT_S * (SETUP_FACTOR if report.when == "setup" else 1))
        and (item.nodeid, report.when) not in EXCEPTIONS
    ):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} ({report.when}) took {report.duration:.0f} s, over the "
            f"{limit:.0f} s its {report.when} may take: make it shorter, or list it with its "
            "time and reason in tests/suite_time.py EXCEPTIONS (at most three)"
        )
