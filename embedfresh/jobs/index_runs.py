"""Rebuild a model's run index: ``python -m embedfresh.jobs.index_runs --root URL --model NAME``.

The run index (``runs/{model}/_index.json``, :mod:`embedfresh.core.run_index`) is what
the web UI reads instead of every run's reports. The gate, promote and rollback jobs
keep it up to date and repair missing entries as they go; this command rebuilds it
from every run's reports and the registry, for a store that has none yet (written
before the index existed) or one a person wants checked. It never touches a report or
the registry. Prints a JSON summary; bad arguments exit 2 with one line on stderr,
storage faults exit with their code from :mod:`embedfresh.core.exit_codes`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from embedfresh.core import run_index
from embedfresh.core.cli import configure_logging, one_line
from embedfresh.core.exit_codes import BadInputError, ExitCode, JobError
from embedfresh.core.layout import safe_id
from embedfresh.core.settings import default_artifact_root
from embedfresh.core.storage import ArtifactStore

PROG = "index_runs"


class _Parser(argparse.ArgumentParser):
    """An argument parser that raises instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise BadInputError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=f"python -m embedfresh.jobs.{PROG}",
        description="Rebuild a model's run index (runs/<model>/_index.json) from every "
        "run's reports and the registry, and print a JSON summary.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--root",
        metavar="URL",
        default=default_artifact_root(),
        help="artifact store root, file:// or s3:// "
        "($EMBEDFRESH_ARTIFACT_ROOT, else $AIRFLOW_HOME/embedfresh-artifacts)",
    )
    parser.add_argument("--model", metavar="NAME", default="tiny", help="model name")
    return parser


def run(argv: Sequence[str] | None = None) -> dict:
    """Parse ``argv``, rebuild the index, return the summary."""
    args = _parser().parse_args(argv)
    model = safe_id(args.model, "model name")
    return run_index.update(ArtifactStore(args.root), model, rebuild=True)


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    try:
        summary = run(argv)
    except JobError as e:
        print(f"{PROG}: error: {one_line(str(e))}", file=sys.stderr)
        return int(e.exit_code)
    print(json.dumps(summary, sort_keys=True))
    return int(ExitCode.OK)


if __name__ == "__main__":
    sys.exit(main())
