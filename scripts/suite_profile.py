"""Seconds per test file (setup, call and teardown added up), slowest first, from the
JUnit XML of a run (``PYTEST_ADDOPTS=--junitxml=FILE make test``): what
tests/suite_time.py's FILE_SECONDS holds.

    .venv/bin/python scripts/suite_profile.py /tmp/suite.xml --top 30
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_file(classname: str) -> str:
    """``tests.airflow.test_triggers[.Class]`` -> ``tests/airflow/test_triggers.py``."""
    parts = classname.split(".")
    while parts and not (ROOT / Path(*parts).with_suffix(".py")).is_file():
        parts.pop()
    return "/".join(parts) + ".py" if parts else classname


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", help="the run's --junitxml file")
    parser.add_argument("--top", type=int, default=30, help="files to print")
    args = parser.parse_args()
    per_file: dict[str, float] = defaultdict(float)
    for case in ET.parse(args.junit).iter("testcase"):
        per_file[test_file(case.get("classname", ""))] += float(case.get("time", 0))
    total = sum(per_file.values())
    print(
        f"{len(per_file)} files, {total:.0f} s of tests ({total / 2 / 60:.1f} min on two workers)"
    )
    for path, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f'    "{path}": {seconds:.0f},')


if __name__ == "__main__":
    main()
