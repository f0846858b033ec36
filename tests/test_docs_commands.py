"""Every shell command in README.md and docs/*.md runs, or says here why it does not.

The shell commands are those of the fenced ``bash``/``sh``/``shell``/``console`` blocks
and of plain blocks whose first line reads as a command. The commands of one block run
in order in one bash process (so ``export``, ``ROOT=...`` and the data a command writes
carry to the next), in a temporary directory that stands for the checkout:

- ``.venv/bin/`` is this interpreter's bin directory (also first on PATH, for ``python``
  and ``torchrun``), and ``$PWD`` is ``tmp_path``, so the README's
  ``ROOT=file://$PWD/artifacts/mine`` lands there;
- absolute ``/tmp/...`` and ``/data/...`` paths move under ``tmp_path``;
  ``EMBEDFRESH_ARTIFACT_ROOT``, ``AIRFLOW_HOME`` and ``ROOT`` point there too;
- every ``file://`` URL a command prints must lie under ``tmp_path``: nothing is written
  into the repository;
- ``DATA_SIZES``, the variable the README documents for a smaller data set (empty for
  the sizes the docs show), holds the tests' sizes (``DATA`` of tests/conftest.py), so a
  ``generate_data`` command that ends with ``$DATA_SIZES`` writes the data set the other
  tests use; every ``generate_data`` command that runs writes at most that
  (``test_documented_data_sets_are_at_most_the_tests_sizes``).

A command that cannot run here is listed in ``NOT_RUN`` (a prefix of the command, with
its whitespace collapsed, and the reason). Anything not listed runs and must exit 0, so
a command added to the docs is tested from then on; an entry that no longer matches any
command fails too.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from embedfresh.jobs import generate_data
from tests.conftest import DATA, ROOT, job_env

DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "console"}
# How the first line of a plain ``` block that holds commands begins.
LOOKS_LIKE_SHELL = re.compile(
    r"^(\$ |\.venv/bin/|\./|python3? |make |export |cd |pip |curl |torchrun |airflow |"
    r"docker|aws |git |[A-Z][A-Z0-9_]*=\S)"
)

SLOW_PARITY = (
    "docs/PARITY.md's figures: two training runs (cpu and torch-xla) with an evaluation "
    "every 25 steps, about 2 minutes; with dropout on it exits 3 (FAIL), as the page says"
)
UI_SERVER = "needs Airflow's API server running with the plugin (make airflow)"

SHARDED_PARITY = (
    "docs/PARITY.md's config-against-config parity: side b spans two hosts; "
    "tests/test_multinode_netns.py::test_hsdp_across_two_hosts_of_two_processes_is_single_"
    "host_ddp_by_the_parity_gate runs the three steps, side b over two network-namespace hosts"
)

# generate_data's size options, and DATA_SIZES: those options at the tests' sizes.
SIZE_OPTIONS = ("train_rows", "eval_rows", "corpus_rows", "corpus_shard_rows", "judged_queries")
DATA_SIZES = " ".join(f"--{key.replace('_', '-')} {DATA[key]}" for key in SIZE_OPTIONS)

NOT_RUN: dict[str, str] = {
    # README.md, Quickstart
    "make demo": "tests/test_demo.py runs scripts/demo.py (what make demo runs) at small sizes",
    "make airflow": "a web server that runs until Ctrl-C; tests/airflow/ start its components",
    "make test": "the whole test suite, this file included",
    # docs/GATE.md
    ".venv/bin/python scripts/demo.py --days 8": (
        "docs/GATE.md's week: eight daily refreshes at the demo's sizes, about 12 minutes; "
        "tests/test_demo.py runs the same script for three days at the tests' sizes"
    ),
    # docs/HEALTH.md
    "torchrun --nproc-per-node 8 -m embedfresh.jobs.health --set backend=cuda": (
        "needs a node with 8 CUDA GPUs"
    ),
    # docs/PARITY.md
    "python -m embedfresh.jobs.generate_data --root file:///tmp/parity": SLOW_PARITY,
    "python -m embedfresh.jobs.train --set artifact_root=file:///tmp/parity": SLOW_PARITY,
    "python -m embedfresh.jobs.parity --set artifact_root=file:///tmp/parity": SLOW_PARITY,
    "python -m embedfresh.jobs.parity ... ": "a sketch: '...' stands for the command above",
    'SETTINGS="--set artifact_root=file:///tmp/parity --set run_id=sharding': SHARDED_PARITY,
    "python -m embedfresh.jobs.launch --standalone --nproc-per-node 2 -m embedfresh.jobs.parity": (
        SHARDED_PARITY
    ),
    "python -m embedfresh.jobs.launch --nnodes 2 --node-rank $NODE": SHARDED_PARITY,
    "python -m embedfresh.jobs.parity $SETTINGS --set step=compare": SHARDED_PARITY,
    # docs/RELIABILITY.md
    "RELIABILITY_FIGURES=/tmp/reliability.json .venv/bin/python -m pytest -q tests/reliability": (
        "the reliability suite, which make test runs"
    ),
    "python -m embedfresh.jobs.rollback --config rollback.yaml": (
        "needs a store with an earlier release; "
        "tests/reliability/test_promotion.py::test_rollback_command_with_a_config_file runs "
        "this command with the rollback.yaml shown"
    ),
    "python -m embedfresh.jobs.release --config promote_anyway.yaml": (
        "needs a store with committed versions; tests/reliability/test_promotion.py::"
        "test_promote_anyway_command_with_a_config_file runs this command with the "
        "promote_anyway.yaml shown"
    ),
    # docs/SEARCH.md
    '.venv/bin/python -m embedfresh.jobs.search --set artifact_root=$ROOT --set query="pilates mat"': (
        "needs a store with a live release: the README's job sequence runs the search CLI "
        "on the release it makes"
    ),
    # docs/UI.md
    "TOKEN=$(curl ": UI_SERVER,
    'curl -s -H "Authorization: Bearer $TOKEN"': UI_SERVER,
}


def _readme_jobs_done(work: Path) -> None:
    """The README's job sequence did what the paragraph under it says, not only exit 0:
    release r1 is live with its products table, and the version is exported."""
    store = work / "artifacts" / "mine"
    registry = json.loads((store / "models" / "tiny" / "registry.json").read_text())
    assert registry["production"]["version"] == "r1", registry
    assert registry["production"]["release"] == "r1", registry
    release = json.loads((store / "models" / "tiny" / "releases" / "r1.json").read_text())
    assert release["corpora"]["products"]["embeddings"]["rows"] == DATA["corpus_rows"]
    assert release["corpora"]["products"]["search_check"]["verdict"] == "PASS"
    export = store / "models" / "tiny" / "versions" / "r1" / "sentence-transformers"
    assert (export / "COMMIT").exists() and (export / "modules.json").exists()


# Checks of what a block left behind, after a command of this prefix ran (and passed).
AFTER: dict[str, Callable[[Path], None]] = {
    ".venv/bin/python -m embedfresh.jobs.export_st --set artifact_root=$ROOT": _readme_jobs_done,
}


@dataclass(frozen=True)
class Command:
    text: str  # as written (continuation lines included)
    line: int

    @property
    def normalized(self) -> str:
        return " ".join(self.text.replace("\\\n", " ").split())

    def not_run_reason(self) -> str | None:
        for prefix, reason in NOT_RUN.items():
            if self.normalized.startswith(" ".join(prefix.split())):
                return reason
        return None


@dataclass(frozen=True)
class Block:
    doc: str  # path relative to the repository
    line: int
    commands: tuple[Command, ...]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _complete(text: str) -> bool:
    """Whether bash reads ``text`` as whole commands (no open loop, quote or ``$(``)."""
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    return proc.returncode == 0


def _commands(body: str, first_line: int, console: bool) -> list[Command]:
    commands: list[Command] = []
    buffer: list[str] = []
    start = first_line
    for offset, raw in enumerate(body.splitlines()):
        line = raw
        if console:  # only the lines after a prompt, and their continuations
            if line.startswith("$ "):
                line = line[2:]
            elif not buffer:
                continue
        if not buffer:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            start = first_line + offset
        buffer.append(line)
        if line.endswith("\\"):
            continue
        text = "\n".join(buffer)
        if _complete(text):
            commands.append(Command(text, start))
            buffer = []
    if buffer:
        commands.append(Command("\n".join(buffer), start))  # runs, and fails, as it is
    return commands


def shell_blocks() -> list[Block]:
    fence = re.compile(r"^([ \t]*)```([\w-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
    blocks = []
    for path in DOC_FILES:
        text = path.read_text()
        for match in fence.finditer(text):
            indent, lang, body = match[1], match[2].lower(), match[3]
            body = "\n".join(line.removeprefix(indent) for line in body.splitlines())
            first = next((ln for ln in body.splitlines() if ln.strip()), "")
            if lang not in SHELL_LANGS and not (lang == "" and LOOKS_LIKE_SHELL.match(first)):
                continue
            line = text[: match.start(3)].count("\n") + 1
            console = lang == "console" or first.startswith("$ ")
            blocks.append(
                Block(
                    str(path.relative_to(ROOT)),
                    line,
                    tuple(_commands(body, line, console)),
                )
            )
    return blocks


BLOCKS = shell_blocks()


def _rewrite(command: str, tmp_path: Path, bindir: Path) -> str:
    """The command as it runs here: the venv's bin, absolute paths under ``tmp_path``."""
    # /tmp/x, file:///tmp/x (not a/tmp/x, ~/tmp/x or $HOME/tmp/x); before the venv's
    # bin goes in, which may itself live under /tmp (a checkout there).
    command = re.sub(
        r"(^|[\s=:'\"]|file://)/(tmp|data)/", rf"\1{tmp_path}/\2/", command, flags=re.M
    )
    return re.sub(r"(?<![\w./$-])\.venv/bin/", f"{bindir}/", command)


def _script(block: Block, tmp_path: Path, logs: Path, bindir: Path) -> str:
    lines = [f"cd {tmp_path}"]
    for i, command in enumerate(block.commands):
        if command.not_run_reason() is not None:
            continue
        text = _rewrite(command.text, tmp_path, bindir)
        for path in re.findall(r"file://(/[^\s\"']*)", text):
            assert path.startswith(f"{tmp_path}/"), f"{block.doc}:{command.line}: file://{path}"
        lines += [
            "{",
            text,
            f"}} > {logs}/{i}.log 2>&1",
            f'rc=$?; echo "{i} $rc" >> {logs}/status; [ "$rc" = 0 ] || exit "$rc"',
        ]
    return "\n".join(lines) + "\n"


def test_the_docs_hold_shell_commands() -> None:
    """The extraction finds what we know is there (and nothing of the plain-text blocks)."""
    found = {c.normalized for b in BLOCKS for c in b.commands}
    assert any("embedfresh.jobs.export_st" in c for c in found)
    assert any(c.startswith("make demo") for c in found)
    assert not any(c.startswith(("===", "{root}", "control plane")) for c in found)
    docs = {b.doc for b in BLOCKS}
    assert {"README.md", "docs/GATE.md", "docs/HEALTH.md", "docs/UI.md"} <= docs


def test_a_loop_over_lines_is_one_command() -> None:
    """A loop written over several lines, with a continuation inside, runs as one
    command from its first line; a comment after it is no command."""
    body = "for d in a b; do\n  echo $d \\\n    x\ndone\n# note\nls\n"
    found = [(c.normalized, c.line) for c in _commands(body, 10, console=False)]
    assert found == [("for d in a b; do echo $d x done", 10), ("ls", 15)]


def test_paths_move_under_the_test_directory(tmp_path: Path) -> None:
    bindir = Path("/venv/bin")
    command = (
        ".venv/bin/python -m x --root file:///tmp/parity --set artifact_root=file:///data/a "
        "--out /tmp/y.json --set 'p=/data/z' R=/tmp/r ~/tmp/keep $HOME/tmp/keep a/tmp/keep"
    )
    assert _rewrite(command, tmp_path, bindir) == (
        f"/venv/bin/python -m x --root file://{tmp_path}/tmp/parity "
        f"--set artifact_root=file://{tmp_path}/data/a --out {tmp_path}/tmp/y.json "
        f"--set 'p={tmp_path}/data/z' R={tmp_path}/tmp/r ~/tmp/keep $HOME/tmp/keep a/tmp/keep"
    )


def test_documented_data_sets_are_at_most_the_tests_sizes() -> None:
    """Every ``generate_data`` command that runs here writes no more than the tests' data
    set: it ends with ``$DATA_SIZES`` (the README's variable), or its own sizes (and the
    defaults it leaves) are at most the tests' ones. The README's job sequence takes the
    variable, and the README says what it is for."""
    takes_the_variable = set()
    for block in BLOCKS:
        for command in block.commands:
            if command.not_run_reason() or "embedfresh.jobs.generate_data" not in command.text:
                continue
            words = shlex.split(command.normalized, comments=True)
            args = words[words.index("embedfresh.jobs.generate_data") + 1 :]
            if args[-1:] == ["$DATA_SIZES"]:
                takes_the_variable.add(block.doc)
                args = args[:-1] + DATA_SIZES.split()
            parsed = vars(generate_data._parser().parse_args(args))
            # (more rows a shard is fewer shards: no more work)
            larger = {
                key: parsed[key]
                for key in SIZE_OPTIONS
                if key != "corpus_shard_rows" and parsed[key] > DATA[key]
            }
            assert not larger, (
                f"{block.doc}:{command.line}: more than the tests' sizes, {larger}; "
                "end it with $DATA_SIZES"
            )
    assert "README.md" in takes_the_variable
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`DATA_SIZES` is for a smaller data set" in readme
    assert f'`DATA_SIZES="{DATA_SIZES}"`' in readme


def test_every_not_run_entry_matches_a_command() -> None:
    """An entry whose command left the docs goes too (and cannot hide a new command)."""
    commands = [c.normalized for b in BLOCKS for c in b.commands]
    stale = [
        prefix
        for prefix in NOT_RUN
        if not any(c.startswith(" ".join(prefix.split())) for c in commands)
    ]
    assert not stale, f"NOT_RUN entries that match no documented command: {stale}"


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_documented_commands_run(block: Block, tmp_path: Path) -> None:
    to_run = [c for c in block.commands if c.not_run_reason() is None]
    if not to_run:
        reasons = sorted({c.not_run_reason() for c in block.commands})
        pytest.skip("; ".join(reasons))
    work, logs = tmp_path / "work", tmp_path / "logs"
    work.mkdir()
    logs.mkdir()
    bindir = Path(sys.executable).parent
    env = job_env(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PJRT_DEVICE": "CPU",
            "PATH": f"{bindir}:{job_env()['PATH']}",
            "ROOT": f"file://{work}/root",
            "EMBEDFRESH_ARTIFACT_ROOT": f"file://{work}/default-artifacts",
            "AIRFLOW_HOME": str(work / "airflow-home"),
            "DATA_SIZES": DATA_SIZES,
        }
    )
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(
        ["bash", "-c", _script(block, work, logs, bindir)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    status = (
        dict(line.split() for line in (logs / "status").read_text().splitlines() if line.strip())
        if (logs / "status").exists()
        else {}
    )
    for i, command in enumerate(block.commands):
        if command.not_run_reason() is not None:
            continue
        where = f"{block.doc}:{command.line}: {command.normalized}"
        log = (logs / f"{i}.log").read_text() if (logs / f"{i}.log").exists() else ""
        assert status.get(str(i)) == "0", (
            f"{where}\nexit {status.get(str(i), 'never ran')} (bash: {proc.returncode})\n"
            f"{log[-4000:]}{proc.stderr[-1000:]}"
        )
        outside = [
            url
            for url in re.findall(r"file://[^\s\"',)]+", log)
            if url != "file:///..." and not url.startswith(f"file://{work}/")
        ]
        assert not outside, f"{where}\nwrote outside the test's directory: {outside}"
    assert proc.returncode == 0, proc.stderr[-2000:]
    for command in to_run:
        for prefix, check in AFTER.items():
            if command.normalized.startswith(" ".join(prefix.split())):
                check(work)
