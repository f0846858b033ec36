"""``python -m embedfresh.jobs.<job> --help`` explains the job: every field of its config
class with its type, its default (or ``required``) and its description.

Every module of ``embedfresh/jobs/`` with a ``__main__`` block is found, not listed: a
job through :func:`embedfresh.core.cli.run_job` has its config fields checked; a program
with its own parser must be named in ``OWN_PARSER``. The ``--help`` runs are in-process
(``runpy``, as ``python -m`` runs them), one is a real subprocess.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import pkgutil
import re
import runpy
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import embedfresh.core.cli as cli
import embedfresh.core.config
import embedfresh.jobs
from embedfresh.core.cli import FIELDS_HEADING
from tests.conftest import ROOT, job_env

JOBS_DIR = Path(embedfresh.jobs.__path__[0])

# Programs with a parser of their own (not run_job), and what their --help must show.
OWN_PARSER = {
    "generate_data": [
        "--root",
        "--dataset NAME",
        "(default: products)",
        "--start DAY",
        "(default: 2026-01-01)",
        "--days N",
        "(default: 2)",
        "--train-rows N",
        "(default: 4000)",
        "--eval-rows N",
        "(default: 10000)",
        "--corpus NAME",
        "--corpus-rows N",
        "(default: 24000)",
        "--corpus-shard-rows N",
        "(default: 6000)",
    ],
    "launch": ["--nproc-per-node", "--nnodes"],  # torchrun's own arguments
    "forkserver": ["--socket", "--idle-s"],
    "index_runs": ["--root URL", "$EMBEDFRESH_ARTIFACT_ROOT", "--model NAME", "(default: tiny)"],
}


def _has_main(path: Path) -> bool:
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__"
        ):
            return True
    return False


JOBS = sorted(
    m.name
    for m in pkgutil.iter_modules([str(JOBS_DIR)])
    if not m.ispkg and _has_main(JOBS_DIR / f"{m.name}.py")
)


def _help(job: str, monkeypatch, capsys) -> tuple[str, type | None]:
    """``--help`` of ``python -m embedfresh.jobs.<job>``, run in this process; the config
    class, when the job goes through ``run_job``."""
    seen: list[type] = []
    real = cli.run_job

    def recording(name, config_cls, fn, argv=None, **kwargs):
        seen.append(config_cls)
        return real(name, config_cls, fn, argv, **kwargs)

    monkeypatch.setattr(cli, "run_job", recording)
    monkeypatch.setattr(sys, "argv", [f"embedfresh.jobs.{job}", "--help"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: module already imported
        with pytest.raises(SystemExit) as exit_:
            runpy.run_module(f"embedfresh.jobs.{job}", run_name="__main__", alter_sys=True)
    out = capsys.readouterr().out
    assert exit_.value.code in (0, None), out
    return out, (seen[0] if seen else None)


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dt.date):
        return value.isoformat()
    return json.dumps(value, separators=(",", ":"))


def _field_blocks(text: str) -> dict[str, str]:
    """The epilog's entry of each field: its ``  name: ...`` line and the lines under it."""
    epilog = text.split(FIELDS_HEADING, 1)[1]
    blocks: dict[str, str] = {}
    name = None
    for line in epilog.splitlines():
        match = re.match(r"^  (\w+): ", line)
        if match:
            name = match[1]
            blocks[name] = line
        elif name is not None and line.startswith("      "):
            blocks[name] += "\n" + line
    return blocks


def test_jobs_are_found() -> None:
    assert {"train", "evaluate", "gate", "embed", "release", "search", "generate_data"} <= set(JOBS)


@pytest.mark.parametrize("job", JOBS)
def test_help_lists_every_config_field(job: str, monkeypatch, capsys) -> None:
    out, config_cls = _help(job, monkeypatch, capsys)
    assert f"embedfresh.jobs.{job}" in out
    if config_cls is None:
        assert job in OWN_PARSER, f"{job} has its own parser: name what its --help shows"
        for expected in OWN_PARSER[job]:
            assert expected in out, f"{expected!r} not in {job} --help:\n{out}"
        return
    assert FIELDS_HEADING in out
    blocks = _field_blocks(out)
    assert list(blocks) == list(config_cls.model_fields), out
    for name, field in config_cls.model_fields.items():
        head = blocks[name].splitlines()[0] + " " + " ".join(blocks[name].split("\n")[1:2])
        if field.is_required():
            assert "required" in head, blocks[name]
        else:
            default = field.default_factory() if field.default_factory else field.default
            assert f"default {_shown(default)}" in head, blocks[name]
        # the description is under the field, a line or more
        assert len(blocks[name].splitlines()) >= 2, f"{job}: {name} has no description"


@pytest.mark.parametrize(
    "config_name",
    sorted(name for name in embedfresh.core.config.__all__ if name.endswith("Config")),
)
def test_every_config_field_has_a_description(config_name: str) -> None:
    """A field without an attribute docstring would show up bare in ``--help``."""
    config_cls = getattr(embedfresh.core.config, config_name)
    missing = [n for n in config_cls.model_fields if not cli.field_description(config_cls, n)]
    assert not missing, f"{config_name}: write a docstring under {missing}"


def test_help_formats_descriptions_as_plain_wrapped_text() -> None:
    from embedfresh.core.config import EvaluateConfig

    text = cli.config_help(EvaluateConfig)
    assert "``" not in text and ":func:" not in text
    assert max(len(line) for line in text.splitlines()) <= cli.HELP_WIDTH
    assert "  version: str | None, default null\n" in text
    assert "  queries: int | None (>= 1), default 4000\n" in text
    assert "(judgments.json), else products." in text


def test_help_in_a_real_process() -> None:
    """``python -m`` itself, as a person types it: exit 0, the fields on stdout."""
    proc = subprocess.run(
        [sys.executable, "-m", "embedfresh.jobs.gate", "--help"],
        cwd=ROOT,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m embedfresh.jobs.gate")
    assert FIELDS_HEADING in proc.stdout
    assert "  tolerance: float (>= 0, < 1), default 0.001\n" in proc.stdout
    assert "0.1% quality SLA" in proc.stdout
