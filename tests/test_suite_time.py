"""The suite's own budget (tests/suite_time.py): the limit on one test fails a test
that runs over it, naming it, and the exceptions stay few, each with its reason."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.suite_time import EXCEPTIONS, FILE_SECONDS


def test_a_test_over_the_limit_fails_naming_itself(tmp_path: Path):
    (tmp_path / "test_slow.py").write_text(
        "import time\n\ndef test_quick():\n    pass\n\ndef test_dawdles():\n    time.sleep(1.5)\n"
    )
    env = {**os.environ, "EMBEDFRESH_TEST_LIMIT_S": "1", "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.suite_time", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_slow.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed" in done.stdout, done.stdout
    assert (
        "test_slow.py::test_dawdles (call) took 2 s, over the 1 s its call may take" in done.stdout
    )


def test_at_most_three_exceptions_each_with_its_time_and_reason():
    assert len(EXCEPTIONS) <= 3, sorted(EXCEPTIONS)
    for (nodeid, phase), why in EXCEPTIONS.items():
        assert phase in ("setup", "call") and " s" in why and len(why) > 20, (nodeid, why)
        assert (ROOT / nodeid.split("::", 1)[0]).is_file(), nodeid


def test_every_file_scheduled_first_exists():
    assert [path for path in FILE_SECONDS if not (ROOT / path).is_file()] == []


def test_every_planted_defect_still_applies_to_the_product():
    """scripts/plant_defects.py (docs/BENCHMARKS.md, "Planted defects") stays runnable:
    each defect's snippet occurs exactly once in this tree (read only), and each names a
    test of the trimmed suite that exists."""
    done = subprocess.run(
        [sys.executable, "scripts/plant_defects.py", "--tree", str(ROOT), "--side", "new",
         "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("applies once:") == 10, done.stdout
    for defect in runpy.run_path(str(ROOT / "scripts/plant_defects.py"))["DEFECTS"]:
        for nodeid in defect.new_tests:
            assert (ROOT / nodeid.split("::", 1)[0]).is_file(), (defect.name, nodeid)
