"""The one entry-point wrapper every job uses: config in, report out, exit code.

``python -m embedfresh.jobs.<name> --config FILE [--set key=value ...] [--result-name NAME]
[--attempt-id ID]``. On success the job's summary is written as its result record
(:mod:`embedfresh.core.results`, what the operator returns as XCom) and printed as the last
stdout line (what a person at a shell reads); on failure nothing is. Errors of the contract
(:mod:`embedfresh.core.exit_codes`) print one line ``<job>: error: <message>`` on stderr and exit
with their code. A storage fault that surfaces outside the artifact store's own
wrappers (a Parquet reader pulling bytes from S3, a connection dropped mid-stream) is
still transient: exit 75, like :class:`~embedfresh.core.exit_codes.TransientError`. Anything else
is a crash (traceback, exit 1) that Airflow retries.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import enum
import inspect
import json
import logging
import os
import re
import signal
import sys
import textwrap
import threading
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from embedfresh.core.config import JobConfig, load_config
from embedfresh.core.exit_codes import ExitCode, JobError, TransientError
from embedfresh.core.layout import safe_id
from embedfresh.core.results import (
    ATTEMPT_ID_OPTION,
    RESULT_NAME_OPTION,
    array_child_name,
    write_result,
)
from embedfresh.core.storage import is_transient

C = TypeVar("C", bound=JobConfig)

log = logging.getLogger(__name__)


def configure_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def _parser(name: str, config_cls: type, fn: Callable[..., Any]) -> argparse.ArgumentParser:
    """A job's command line: ``--config``, ``--set``, the result record's name and the
    attempt id; ``--help`` shows the job's docstring and every config field."""
    parser = argparse.ArgumentParser(
        prog=f"python -m embedfresh.jobs.{name}",
        description=inspect.cleandoc(fn.__doc__ or ""),
        epilog=config_help(config_cls),
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    parser.add_argument(
        RESULT_NAME_OPTION,
        dest="result_name",
        metavar="NAME",
        help="name of the result record written on success, "
        f"runs/<model>/<run_id>/results/NAME.json (default: {name})",
    )
    parser.add_argument(
        ATTEMPT_ID_OPTION,
        dest="attempt_id",
        metavar="ID",
        help="copied into the result record, so whoever started this execution can tell "
        "its record from one an earlier execution left",
    )
    return parser


def run_job(
    name: str,
    config_cls: type[C],
    fn: Callable[[C], dict[str, Any]],
    argv: Sequence[str] | None = None,
    *,
    read_only: bool = False,
) -> int:
    """Parse arguments, run ``fn(config)``, record and print its summary, return the exit code.

    The result record goes to ``runs/{model}/{run_id}/results/{result name}.json`` of the
    config's store, written after ``fn`` returned and before the summary is printed, so a
    record exists only for an execution that succeeded. Under torchrun only global rank 0
    writes it: the other ranks return their own small summaries. A ``read_only`` program
    (a search at a shell) takes no lease and writes no record: it only prints.
    """
    args = _parser(name, config_cls, fn).parse_args(argv)
    configure_logging()
    try:
        # The children of an AWS Batch array job share one command line: each adds its
        # index to the record's name, so every child's record is its own object.
        result_name = array_child_name(safe_id(args.result_name or name, "result name"))
        config = load_config(config_cls, args.config, args.overrides)
        started_at = dt.datetime.now(dt.UTC)
        lease = contextlib.nullcontext() if read_only else _lease(name, config)
        with _sigterm_exits_75(), lease:  # one writer per unit of work
            summary = fn(config)
            if _is_global_rank_zero() and not read_only:
                url = write_result(
                    config,
                    job=name,
                    name=result_name,
                    attempt_id=args.attempt_id,
                    summary=summary,
                    started_at=started_at,
                )
                log.info("result record written: %s", url)
    except JobError as e:
        print(f"{name}: error: {one_line(str(e))}", file=sys.stderr, flush=True)
        return int(e.exit_code)
    except Exception as e:
        if not (is_transient(e) or lost_peer(e)):
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


def lost_peer(exc: BaseException | None) -> bool:
    """A collective failed because another rank's host went away: gloo's transport
    reset or timed out (a ``RuntimeError`` from ``gloo/transport``), or c10d's
    ``DistNetworkError``. Transient: the retry, on nodes that are all there, resumes
    from the checkpoint. Matched by name and message (core imports no torch). NCCL's
    ``DistBackendError`` is left out: it can also mean a faulty device."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ == "DistNetworkError" or (
            isinstance(exc, RuntimeError) and "gloo/transport/" in str(exc)
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class Terminated(TransientError):
    """SIGTERM outside the training loop's own handling (which checkpoints first)."""


@contextlib.contextmanager
def _sigterm_exits_75() -> Iterator[None]:
    """SIGTERM (Airflow's on_kill, Batch stopping a job, Spot) ends the job as a
    transient fault: exit 75 with one line, its lease released, everything committed
    kept; the training loop installs its own handler while it runs (a checkpoint of the
    step first). Main thread only: Python delivers signals there."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Terminated("stopped by SIGTERM; the retry resumes from what is committed")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _lease(name: str, config: BaseModel) -> Iterator[None]:
    """The lease of the job's unit of work (:mod:`embedfresh.core.leases`), taken by
    global rank 0 right before the job's first write under its artifact root (after
    every check of its input: a refused job writes nothing, not even a lease) and
    released when the job ends; nothing for configs that name no run."""
    if not isinstance(config, JobConfig) or not _is_global_rank_zero():
        yield
        return
    from embedfresh.core.leases import Lease
    from embedfresh.core.storage import ArtifactStore, before_first_write

    store = ArtifactStore(config.artifact_root)
    held: list[Lease] = []

    def take() -> None:
        held.append(Lease.acquire(store, config.model, config.run_id, config.lease_unit(name)))

    before_first_write(store.root, take)
    try:
        yield
    finally:
        before_first_write(store.root, None)
        for lease in held:
            lease.release()


def one_line(message: str) -> str:
    """``message`` with its line breaks (and the indentation after them) as one space: the
    error contract is one line on stderr, whatever text a library's exception holds."""
    return re.sub(r"\s*\n\s*", " ", message.strip())


FIELDS_HEADING = "config fields (--set KEY=VALUE or --config FILE):"
HELP_WIDTH = 88


def config_help(config_cls: type[BaseModel]) -> str:
    """The ``--help`` epilog: every field of ``config_cls`` with its type, its default (or
    ``required``) and its description (the attribute docstring under the field)."""
    lines = [FIELDS_HEADING]
    for name, field in config_cls.model_fields.items():
        head, default = field_summary(field)
        if len(f"  {name}: {head}, {default}") <= HELP_WIDTH:
            lines.append(f"  {name}: {head}, {default}")
        else:  # a long type or default: the default on a line of its own
            lines += [f"  {name}: {head},", f"      {default}"]
        text = _plain(field_description(config_cls, name) or "")
        if text:
            lines += textwrap.wrap(
                text, HELP_WIDTH, initial_indent=" " * 6, subsequent_indent=" " * 6
            )
    return "\n".join(lines)


def field_summary(field: FieldInfo) -> tuple[str, str]:
    """``("int (>= 1)", "default 4096")``, ``("str", "required")``: type and bounds, default."""
    bounds = []
    for item in field.metadata:
        for attr, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(item, attr, None) is not None:
                bounds.append(f"{op} {getattr(item, attr)}")
        if getattr(item, "min_length", None):
            bounds.append("non-empty" if item.min_length == 1 else f">= {item.min_length} items")
    summary = _type_name(field.annotation) + (f" ({', '.join(bounds)})" if bounds else "")
    if field.is_required():
        return summary, "required"
    return summary, f"default {format_default(_default(field))}"


def format_default(value: Any) -> str:
    """A default as it is written after ``--set KEY=``: strings bare, the rest as compact
    JSON (``null``, ``true``, ``[16,32]``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return format_default(value.value)
    try:
        return json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError):
        return repr(value)


def field_description(config_cls: type[BaseModel], name: str) -> str | None:
    """The field's description; a subclass that redefines a field without a docstring
    (a new default, say) keeps the description of the class it inherits it from."""
    for klass in config_cls.__mro__:
        fields = getattr(klass, "model_fields", None)
        if isinstance(fields, dict) and name in fields and fields[name].description:
            return fields[name].description
    return None


def _default(field: FieldInfo) -> Any:
    if field.default_factory is None:
        return field.default
    try:
        return field.default_factory()
    except TypeError:  # a factory that takes the validated data: no value without it
        return "<computed>"


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return "{" + ",".join(str(a) for a in args) + "}"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        base = getattr(origin, "__name__", str(origin))
        return f"{base}[{', '.join(_type_name(a) for a in args)}]" if args else base
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


_ROLE = re.compile(r":[\w:]+:`(~?)([^`]+)`")


def _plain(text: str) -> str:
    """A docstring as plain text on one line: reST roles and double backticks dropped."""
    text = _ROLE.sub(lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], text)
    return " ".join(text.replace("``", "").split())


def _is_global_rank_zero() -> bool:
    """True outside torchrun, and on global rank 0 under it (``RANK``, set by torchrun)."""
    return os.environ.get("RANK", "0").strip() in ("", "0")


def main_for(
    name: str, config_cls: type[C], fn: Callable[[C], dict[str, Any]], *, read_only: bool = False
) -> None:
    sys.exit(run_job(name, config_cls, fn, read_only=read_only))
