"""The reliability suite: SIGKILLs during training, S3 faults on a real HTTP endpoint,
and the bad-input catalogue. Shared fixtures come from ``tests/conftest.py``; this file
adds the figures summary at the end of the session."""

from __future__ import annotations

from tests.reliability import figures


def pytest_terminal_summary(terminalreporter) -> None:
    lines = figures.summary_lines()
    if lines:
        terminalreporter.section("reliability figures")
        for line in lines:
            terminalreporter.write_line(line)
    figures.write_json()
