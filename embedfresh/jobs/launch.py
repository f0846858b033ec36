"""torchrun that keeps the exit-code contract: ``python -m embedfresh.jobs.launch <torchrun args>``.

``torchrun`` (``torch.distributed.run``) exits 1 whenever a worker fails, whatever the
worker's own code was, so a health failure (4) or a bad config (2) under data parallel
would reach Airflow as a crash and be retried. This launcher takes the same arguments,
runs the same elastic agent, and exits with the exit code of the first worker that
failed (the root cause torchrun reports): 2, 3, 4 and 75 keep their meaning. A worker
killed by a signal exits ``128 + signal``, as a shell reports it.

Used by the local runner for ``nproc_per_node > 1`` and by the AWS Batch runner's
multi-node launcher.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run


def exit_code_of(error: ChildFailedError) -> int:
    """The contract exit code of a failed launch: the first failed worker's own code."""
    _, failure = error.get_first_failure()
    code = failure.exitcode
    if code < 0:  # killed by a signal
        return 128 - code
    return code or 1


def _parser() -> argparse.ArgumentParser:
    """torchrun's own parser (its arguments, unchanged) under this program's name."""
    parser = get_args_parser()
    parser.prog = "python -m embedfresh.jobs.launch"
    parser.description = (
        "torchrun that keeps the exit-code contract: the same arguments as torchrun, and "
        "the exit code of the first worker that failed (2, 3, 4 and 75 keep their "
        "meaning; a worker killed by a signal gives 128 + signal)."
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        run(args)
    except SignalException as e:
        # SIGTERM to the launcher (the runner's kill, Batch stopping the job): torchrun
        # forwarded it to the workers, which checkpoint and exit 75; so does the launch.
        print(
            f"launch: stopped by signal {e.sigval.name}; the workers were told to "
            "checkpoint: retry the task to resume",
            file=sys.stderr,
        )
        return 75
    except ChildFailedError as e:
        rank, _ = e.get_first_failure()
        code = exit_code_of(e)
        print(f"launch: rank {rank} failed first; exiting with its code {code}", file=sys.stderr)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
