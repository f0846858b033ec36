"""The one entry-point wrapper every job uses: config in, report out, exit code.

``python -m embedfresh.jobs.<name> --config FILE [--set key=value ...]``. Errors of the contract
(:mod:`embedfresh.core.exit_codes`) print one line ``<job>: error: <message>`` on stderr and exit
with their code. A storage fault that surfaces outside the artifact store's own
wrappers (a Parquet reader pulling bytes from S3, a connection dropped mid-stream) is
still transient: exit 75, like :class:`~embedfresh.core.exit_codes.TransientError`. Anything else
is a crash (traceback, exit 1) that Airflow retries.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from embedfresh.core.config import load_config
from embedfresh.core.exit_codes import ExitCode, JobError
from embedfresh.core.storage import is_transient

C = TypeVar("C", bound=BaseModel)


def configure_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def run_job(
    name: str,
    config_cls: type[C],
    fn: Callable[[C], dict[str, Any]],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse arguments, run ``fn(config)``, print its summary, return the exit code."""
    parser = argparse.ArgumentParser(
        prog=f"python -m embedfresh.jobs.{name}", description=fn.__doc__
    )
    parser.add_argument("--config", help="JSON or YAML file with the job's config")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config field (value parsed as JSON when possible)",
    )
    args = parser.parse_args(argv)
    configure_logging()
    try:
        config = load_config(config_cls, args.config, args.overrides)
        summary = fn(config)
    except JobError as e:
        print(f"{name}: error: {e}", file=sys.stderr, flush=True)
        return int(e.exit_code)
    except Exception as e:
        if not is_transient(e):
            raise
        print(
            f"{name}: error: transient infrastructure fault ({type(e).__name__}: {e}); "
            "retry the task: it resumes from the last committed checkpoint",
            file=sys.stderr,
            flush=True,
        )
        return int(ExitCode.TRANSIENT)
    print(json.dumps(summary, sort_keys=True), flush=True)
    return int(ExitCode.OK)


def main_for(name: str, config_cls: type[C], fn: Callable[[C], dict[str, Any]]) -> None:
    sys.exit(run_job(name, config_cls, fn))
