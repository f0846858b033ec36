"""Write the synthetic product-search data set: ``python -m embedfresh.jobs.generate_data ...``.

Generates the daily training partitions, the eval split and the corpus shards with
:func:`embedfresh.ml.data.generate.write_dataset` and prints its summary as JSON. Every
argument has a default: with none, it writes the embedded demo's data set (``make demo``'s
sizes: data set and corpus ``products``, two days from 2026-01-01) into the artifact root
the jobs and DAGs use by default. Bad arguments exit 2 with one line on stderr; storage
faults exit with their code from :mod:`embedfresh.core.exit_codes` (75 when worth retrying).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from embedfresh.core.exit_codes import BadInputError, ExitCode, JobError
from embedfresh.core.settings import default_artifact_root
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.data.generate import CATALOGUE_SIZE, write_dataset

PROG = "generate_data"
#: The embedded demo's first day (``scripts/demo.py``, the DAGs' start date).
DEFAULT_START = dt.date(2026, 1, 1)
#: Judged queries of the demo's pool: enough for the gate to grow into on a day that
#: changes little (docs/GATE.md, "How many judged queries").
DEFAULT_JUDGED_QUERIES = 32_000


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
    parser = _Parser(
        prog=f"python -m embedfresh.jobs.{PROG}",
        description="Write the synthetic product-search data set (daily training partitions, "
        "the eval split, the corpus shards) and print its summary as JSON. With no "
        "arguments: the embedded demo's data set, into the jobs' default artifact root.",
        formatter_class=_Formatter,
    )
    add = parser.add_argument
    add(
        "--root",
        metavar="URL",
        default=default_artifact_root(),
        help="artifact store root, file:// or s3:// "
        "($EMBEDFRESH_ARTIFACT_ROOT, else $AIRFLOW_HOME/embedfresh-artifacts)",
    )
    add("--dataset", metavar="NAME", default="products", help="data set name")
    add("--seed", metavar="N", type=_seed, default=0, help="same arguments, same bytes")
    add("--start", metavar="DAY", type=_date, default=DEFAULT_START, help="first day, YYYY-MM-DD")
    add("--days", metavar="N", type=_count, default=2, help="daily training partitions")
    add("--train-rows", metavar="N", type=_count, default=4000, help="training rows per day")
    add("--eval-rows", metavar="N", type=_count, default=10000, help="held-out eval rows")
    add("--corpus", metavar="NAME", default="products", help="corpus name")
    add(
        "--corpus-rows",
        metavar="N",
        type=_count,
        default=CATALOGUE_SIZE,
        help="texts in the corpus; the default: every catalogue product",
    )
    add("--corpus-shard-rows", metavar="N", type=_count, default=6000, help="texts per shard")
    add(
        "--judged-queries",
        metavar="N",
        type=_count,
        default=DEFAULT_JUDGED_QUERIES,
        help="held-out queries judged against the whole corpus (the search metrics' pool; "
        "docs/GATE.md says why this many)",
    )
    add(
        "--judgments",
        choices=("complete", "sparse"),
        default="complete",
        help="complete: every corpus product graded per judged query; sparse: the eval "
        "split's own candidates only, as a team's labels are (docs/DATA.md)",
    )
    return parser


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help."""


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
        judged_queries=args.judged_queries,
        judgments=args.judgments,
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
