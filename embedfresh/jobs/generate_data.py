"""Write the synthetic product-search data set: ``python -m embedfresh.jobs.generate_data ...``.

Generates the daily training partitions, the eval split and the corpus shards with
:func:`embedfresh.ml.data.generate.write_dataset` and prints its summary as JSON. Bad arguments
exit 2 with one line on stderr; storage faults exit with their code from
:mod:`embedfresh.core.exit_codes` (75 when worth retrying).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from embedfresh.core.exit_codes import BadInputError, ExitCode, JobError
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.data.generate import write_dataset

PROG = "generate_data"


class _Parser(argparse.ArgumentParser):
    """An argument parser that raises instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise BadInputError(message)


def _date(value: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {value!r}") from None


def _count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value!r}")
    return number


def _seed(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value!r}")
    return number


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="artifact store root (file:// or s3://)")
    parser.add_argument("--dataset", required=True, help="data set name")
    parser.add_argument("--seed", type=_seed, default=0)
    parser.add_argument("--start", type=_date, required=True, help="first day, YYYY-MM-DD")
    parser.add_argument("--days", type=_count, default=1)
    parser.add_argument("--train-rows", type=_count, default=4000, help="rows per day")
    parser.add_argument("--eval-rows", type=_count, default=2000)
    parser.add_argument("--corpus", required=True, help="corpus name")
    parser.add_argument("--corpus-rows", type=_count, default=5000)
    parser.add_argument("--corpus-shard-rows", type=_count, default=100_000)
    return parser


def run(argv: Sequence[str] | None = None) -> dict:
    """Parse ``argv``, write the data set, return the summary."""
    args = _parser().parse_args(argv)
    return write_dataset(
        ArtifactStore(args.root),
        name=args.dataset,
        seed=args.seed,
        start=args.start,
        days=args.days,
        train_rows=args.train_rows,
        eval_rows=args.eval_rows,
        corpus_name=args.corpus,
        corpus_rows=args.corpus_rows,
        corpus_shard_rows=args.corpus_shard_rows,
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        summary = run(argv)
    except JobError as e:
        message = " ".join(str(e).split())  # one line, whatever the error text holds
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return int(e.exit_code)
    print(json.dumps(summary, indent=2, sort_keys=True))
    return int(ExitCode.OK)


if __name__ == "__main__":
    sys.exit(main())
