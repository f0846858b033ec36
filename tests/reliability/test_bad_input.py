"""The bad-input catalogue: bad input ends a job with exit code 2 and one line
``<job>: error: ...`` on stderr that names the problem, and leaves nothing half-written
in the store: no model version, no report, and the registry and the published
embeddings byte-identical (sha256 of every file of the store, before and after).

Each case runs the real program (``python -m embedfresh.jobs.<name>``) against a private copy of
a store that already has a production model (``prod``, a release without corpora) and its
embeddings, with the broken part written through pyarrow. docs/RELIABILITY.md lists
every case with the test that proves it. Two in-process tests widen a case the real
program proves once: every float field of every job config must be finite, and which
folder names under a data set's ``train/`` are partitions.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import typing
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from embedfresh.core.exit_codes import BadInputError, ExitCode
from embedfresh.core.registry import Registry
from embedfresh.core.storage import ArtifactStore
from embedfresh.core.storage.local import STAGING
from embedfresh.ml.data.schema import demo_pair_schema
from tests.conftest import ROOT, job_env, run_job
from tests.releasing import bare_release

RUN = "bad"
START = "data_interval_start=2026-01-01"
PROD = "prod"


@pytest.fixture(scope="module")
def published(data_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated data set plus what production looks like: version ``prod``
    trained, released, and the corpus embedded with it."""
    dest = tmp_path_factory.mktemp("published") / "artifacts"
    shutil.copytree(data_template, dest)
    root = f"file://{dest}"
    trained = run_job(
        "train", f"artifact_root={root}", f"run_id={PROD}", START, "max_steps=2", "init=base"
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    bare_release(ArtifactStore(root), "tiny", PROD)
    embedded = run_job("embed", f"artifact_root={root}", f"run_id={PROD}", f"version={PROD}")
    assert embedded.returncode == 0, embedded.stderr[-3000:]
    assert (dest / "embeddings/tiny/prod/products/part-00000.COMMIT").exists()
    return dest


@pytest.fixture
def root(published: Path, tmp_path: Path) -> str:
    """A private copy of :func:`published`."""
    dest = tmp_path / "artifacts"
    shutil.copytree(published, dest)
    return f"file://{dest}"


def _dir(root: str) -> Path:
    return Path(root.removeprefix("file://"))


def _part(root: str, day: str = "2026-01-01") -> Path:
    return _dir(root) / f"datasets/products/train/dt={day}/part-00000.parquet"


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` (hidden ones included) with its sha256; the store's
    scratch folder (``.staging``: the compare-and-swap lock files a job that wrote its
    lease leaves) left out."""
    if not directory.exists():
        return {}
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.relative_to(directory).parts[0] != STAGING
    }


def assert_one_line_error(result: subprocess.CompletedProcess, job: str, *words: str) -> str:
    assert result.returncode == ExitCode.BAD_INPUT, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stdout == "", "a failed job printed a summary"
    lines = result.stderr.strip().splitlines()
    errors = [ln for ln in lines if f"{job}: error:" in ln]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr[-3000:]
    line = errors[0]
    assert line.startswith(f"{job}: error: ")
    for word in words:
        assert word in line, f"{word!r} not in {line!r}"
    return line


def assert_nothing_published(root: str, before: dict[str, str], run_id: str = RUN) -> None:
    base = _dir(root)
    assert not (base / f"models/tiny/versions/{run_id}/COMMIT").exists()
    assert not (base / f"runs/tiny/{run_id}/reports/train.json").exists()
    assert snapshot(base) == before, "the failed job changed the store"
    assert any(k.startswith("models/tiny/registry.json") for k in before)
    assert any(k.startswith("embeddings/tiny/prod/") for k in before)


# -- broken partitions -------------------------------------------------------------------


def _rewrite(root: str, change: Callable[[pa.Table], pa.Table], day: str = "2026-01-01") -> None:
    path = _part(root, day)
    pq.write_table(change(pq.read_table(path)), path)


def _set_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def _with_value(name: str, row: int, value: float) -> Callable[[pa.Table], pa.Table]:
    def change(table: pa.Table) -> pa.Table:
        values = table.column(name).to_numpy().copy()
        values[row] = value
        return _set_column(table, name, pa.array(values, type=pa.float32()))

    return change


def _label_as_words(table: pa.Table) -> pa.Table:
    words = ["relevant" if v else "irrelevant" for v in table.column("label").to_pylist()]
    return _set_column(table, "label", pa.array(words, type=pa.string()))


def _label_two(table: pa.Table) -> pa.Table:
    labels = table.column("label").to_numpy().copy()
    labels[5] = 2
    return _set_column(table, "label", pa.array(labels, type=pa.int8()))


def _null_query(table: pa.Table) -> pa.Table:
    queries = table.column("query").to_pylist()
    queries[9] = None
    return _set_column(table, "query", pa.array(queries, type=pa.string()))


def _not_parquet(root: str) -> None:
    _part(root).write_bytes(b"this is not parquet\x00\xff" * 100)


def _empty(root: str) -> None:
    pq.write_table(demo_pair_schema().empty_table(), _part(root))


def _misnamed_partitions(root: str, *names: str) -> None:
    """Folders holding a day's data under names no job reads (they used to be skipped)."""
    for name in names:
        folder = _part(root).parent.with_name(name)
        folder.mkdir()
        shutil.copy(_part(root), folder / "part-00000.parquet")


CASES = {
    "missing-partition": (
        ["data_interval_start=2026-03-01"],
        None,
        ["missing training partition", "dt=2026-03-01"],
    ),
    "missing-day-inside-the-interval": (
        [START, "data_interval_end=2026-01-04"],
        None,
        ["missing training partition", "dt=2026-01-03"],
    ),
    "empty-partition": ([START], _empty, ["empty training partition", "dt=2026-01-01"]),
    "missing-column": (
        [START],
        lambda r: _rewrite(r, lambda t: t.drop_columns(["rating"])),
        ["wrong schema", "dt=2026-01-01/part-00000.parquet", "missing columns ['rating']"],
    ),
    "label-as-string": (
        [START],
        lambda r: _rewrite(r, _label_as_words),
        [
            "wrong schema",
            "dt=2026-01-01/part-00000.parquet",
            "column label is string, expected an integer",
        ],
    ),
    "label-out-of-range": (
        [START],
        lambda r: _rewrite(r, _label_two),
        ["label must be 0 or 1", "dt=2026-01-01/part-00000.parquet"],
    ),
    "null-in-a-column": (
        [START],
        lambda r: _rewrite(r, _null_query),
        ["wrong schema", "query has 1 nulls"],
    ),
    "not-parquet": (
        [START],
        _not_parquet,
        ["dt=2026-01-01/part-00000.parquet", "not a readable Parquet file"],
    ),
    "nan-feature": (
        [START],
        lambda r: _rewrite(r, _with_value("price", 17, np.nan)),
        ["feature price", "NaN/inf", "row 17", "dt=2026-01-01/part-00000.parquet"],
    ),
    "inf-feature": (
        [START],
        lambda r: _rewrite(r, _with_value("rating", 3, np.inf)),
        ["feature rating", "NaN/inf", "row 3"],
    ),
    "unknown-model": (
        [START, "model=huge"],
        None,
        ["model 'huge' is not a preset", "embedfresh.jobs.publish_model"],
    ),
    "unknown-backend": ([START, "backend=tpu"], None, ["unknown backend 'tpu'"]),
    "epochs-zero": ([START, "epochs=0"], None, ["invalid TrainConfig", "epochs"]),
    "date-not-a-date": (
        ["data_interval_start=notadate"],
        None,
        ["invalid TrainConfig", "data_interval_start"],
    ),
    # No date is the newest partition (a manual run's default); with none there is
    # nothing to train on.
    "no-date-no-partition": (
        [],
        lambda r: shutil.rmtree(_part(r).parent.parent),
        ["no training partition under", "python -m embedfresh.jobs.generate_data"],
    ),
    "end-before-start": (
        [START, "data_interval_end=2025-12-31"],
        None,
        ["empty data interval", "2025-12-31"],
    ),
    "unknown-param": ([START, "epoch=3"], None, ["invalid TrainConfig", "epoch"]),
    "run-id-escapes": ([START, "run_id=../../etc"], None, ["invalid run id", "../../etc"]),
    "malformed-partition-folders": (
        [START],
        lambda r: _misnamed_partitions(r, "dt=2026-1-3", "dt=yesterday"),
        [
            "malformed training partition folder",
            "datasets/products/train/dt=2026-1-3",
            "(and 1 more: dt=yesterday)",
            "dt=YYYY-MM-DD",
        ],
    ),
    "learning-rate-infinity": (
        [START, "learning_rate=Infinity"],
        None,
        ["invalid TrainConfig", "learning_rate: Input should be a finite number"],
    ),
    "learning-rate-nan": (
        [START, "learning_rate=NaN"],
        None,
        ["invalid TrainConfig", "learning_rate: Input should be a finite number"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_train_bad_input(root, case):
    sets, prepare, words = CASES[case]
    if prepare is not None:
        prepare(root)
    before = snapshot(_dir(root))
    result = run_job("train", f"artifact_root={root}", f"run_id={RUN}", *sets)
    assert_one_line_error(result, "train", *words)
    assert_nothing_published(root, before)


# -- duplicate rows: (query_id, doc_id) identifies a row -----------------------------------


def _copy_row(target: Path, row: int, source: Path, source_row: int) -> tuple[int, int]:
    """Overwrite row ``row`` of ``target`` with row ``source_row`` of ``source`` (a row
    exported twice); returns the copied (query_id, doc_id)."""
    table, copied = pq.read_table(target), pq.read_table(source).slice(source_row, 1)
    rows = table.to_pylist()
    rows[row] = copied.to_pylist()[0]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), target)
    return copied.column("query_id")[0].as_py(), copied.column("doc_id")[0].as_py()


def test_train_duplicate_row_across_two_days(root):
    """Day 2 holds a row of day 1: the interval of both days is refused, naming the key,
    the repeat (file, row) and the row it repeats."""
    query_id, doc_id = _copy_row(_part(root, "2026-01-02"), 7, _part(root), 3)
    before = snapshot(_dir(root))
    result = run_job(
        "train", f"artifact_root={root}", f"run_id={RUN}", START, "data_interval_end=2026-01-03"
    )
    assert_one_line_error(
        result,
        "train",
        "duplicate training row",
        f"(query_id={query_id}, doc_id={doc_id})",
        "at row 7 of file://",
        "dt=2026-01-02/part-00000.parquet repeats row 3 of file://",
        "dt=2026-01-01/part-00000.parquet",
        "(1 duplicate rows in all)",
        "identified by (query_id, doc_id)",
    )
    assert_nothing_published(root, before)


def test_evaluate_duplicate_eval_row(root):
    """The eval split follows the same rule: a pair twice would be counted twice by the
    metrics (and a ranking would list the product twice)."""
    (part,) = (_dir(root) / "datasets/products/eval").rglob("*.parquet")
    query_id, doc_id = _copy_row(part, 20, part, 11)
    before = snapshot(_dir(root))
    result = run_job("evaluate", f"artifact_root={root}", f"run_id={RUN}", f"version={PROD}")
    assert_one_line_error(
        result,
        "evaluate",
        "duplicate eval row",
        f"(query_id={query_id}, doc_id={doc_id})",
        "at row 20 of file://",
        "datasets/products/eval/part-00000.parquet repeats row 11 of",
        "counted twice by the metrics",
    )
    assert not (_dir(root) / f"runs/tiny/{RUN}/reports/eval.json").exists()
    assert snapshot(_dir(root)) == before


# -- config files and config values -------------------------------------------------------

CONFIG_FILES = {
    "yaml-syntax": (
        "data_interval_start: 2026-01-01\nepochs: 3\n  learning_rate: 0.001\n",
        ["line 3, column 16: mapping values are not allowed here"],
    ),
    "duplicate-key": (
        "data_interval_start: 2026-01-01\nepochs: 3\nepochs: 30\n",
        ["line 3, column 1: key 'epochs' given a second time (first at line 2, column 1)"],
    ),
}


@pytest.mark.parametrize("case", list(CONFIG_FILES))
def test_malformed_config_file(root, tmp_path, case):
    """One line naming the file, the position (line, column from 1) and the problem,
    not PyYAML's five lines quoting the document (or, for a key given twice, nothing:
    the last one used to win)."""
    text, words = CONFIG_FILES[case]
    config = tmp_path / "train.yaml"
    config.write_text(text)
    before = snapshot(_dir(root))
    cmd = [sys.executable, "-m", "embedfresh.jobs.train", "--config", str(config)]
    cmd += ["--set", f"artifact_root={root}", "--set", f"run_id={RUN}"]
    result = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True)
    assert_one_line_error(result, "train", f"config {config} is not valid JSON/YAML", *words)
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert snapshot(_dir(root)) == before


def _job_configs() -> list[type]:
    import embedfresh.core.config  # noqa: F401 - defines every job's config
    from embedfresh.core.config import JobConfig

    found, todo = [], [JobConfig]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def _non_finite_input(annotation: object, value: float) -> object | None:
    """``value`` shaped as a field of type ``annotation`` takes it: bare, as a dict value
    or a list item; None when the type holds no float."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is float:
        return value
    if origin is dict:
        keys = typing.get_args(args[0]) if typing.get_origin(args[0]) is typing.Literal else ()
        inner = _non_finite_input(args[1], value)
        return None if inner is None else {keys[0] if keys else "x": inner}
    if origin is list:
        inner = _non_finite_input(args[0], value)
        return None if inner is None else [inner]
    for arg in args:  # float | None
        inner = _non_finite_input(arg, value)
        if inner is not None:
            return inner
    return None


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_every_float_of_every_job_config_must_be_finite(value):
    """In-process, over every config class and float field (dict values included): what
    ``--set learning_rate=Infinity`` and ``--set learning_rate=NaN`` prove end to end
    above holds for every job. A bound like ``gt=0`` let inf through before."""
    checked = []
    for config in _job_configs():
        for name, field in config.model_fields.items():
            given = _non_finite_input(field.annotation, value)
            if given is None:
                continue
            with pytest.raises(ValidationError) as info:
                config.model_validate({name: given})
            kinds = {e["type"] for e in info.value.errors() if e["loc"][0] == name}
            assert kinds == {"finite_number"}, (config.__name__, name, info.value.errors())
            checked.append(f"{config.__name__}.{name}")
    assert {"TrainConfig.learning_rate", "TrainConfig.instance_prices"} <= set(checked)
    assert "HealthConfig.min_busbw_gbps" in checked and "GateConfig.tolerance" in checked


# -- training partition folders, in-process: which names are partitions ------------------


@pytest.mark.parametrize(
    "name, refused",
    [
        ("dt=2026-01-03", False),
        ("_SUCCESS", False),
        (".DS_Store", False),
        ("dt=2026-1-3", True),
        ("dt=yesterday", True),
        ("dt=20260103", True),  # date.fromisoformat takes it; the layout never writes it
        ("dt=2026-02-30", True),
        ("2026-01-03", True),
    ],
)
def test_partition_folder_names(data_template, tmp_path, name, refused):
    from embedfresh.core.partitions import partition_days

    dest = tmp_path / "artifacts"
    shutil.copytree(data_template / "datasets", dest / "datasets")
    (dest / "datasets/products/train" / name).mkdir()
    store = ArtifactStore(f"file://{dest}")
    if refused:
        with pytest.raises(BadInputError, match=f"malformed training partition folder .*/{name}"):
            partition_days(store, "products")
    else:
        days = [d.isoformat() for d in partition_days(store, "products")]
        assert days == sorted({"2026-01-01", "2026-01-02", *([name[3:]] if "=" in name else [])})


# -- an artifact root that cannot be written -------------------------------------------------


def test_root_under_a_regular_file(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the root's parent directory should be")
    root = f"file://{blocker}/artifacts"
    result = run_job("train", f"artifact_root={root}", f"run_id={RUN}", START)
    assert_one_line_error(result, "train", "artifact root", str(blocker), "not a usable directory")
    assert blocker.read_text().startswith("a file where")


def test_run_directory_blocked_by_a_file(root):
    """Data readable, but ``runs`` is a regular file: checkpoints cannot be written."""
    shutil.rmtree(_dir(root) / "runs")  # the reports of the production run
    (_dir(root) / "runs").write_text("blocks the runs/ directory")
    before = snapshot(_dir(root))
    result = run_job(
        "train", f"artifact_root={root}", f"run_id={RUN}", START, "epochs=1", "init=base"
    )
    assert_one_line_error(result, "train", "artifact root", "not a usable directory")
    assert_nothing_published(root, before)


def _read_only_mount_works(directory: Path) -> bool:
    probe = (
        'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && ! touch "$1/.probe" 2>/dev/null'
    )
    try:
        done = subprocess.run(
            ["unshare", "--mount", "sh", "-c", probe, "sh", str(directory)],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and not (directory / ".probe").exists()


def run_on_read_only_root(directory: Path, *sets: str) -> subprocess.CompletedProcess:
    """Run train with ``directory`` read-only for the job alone.

    As root, a private read-only bind mount (``unshare --mount``: the test process and
    the rest of the machine keep a writable view, and nothing outlives the job); chmod
    does not stop root. Otherwise the tree is made read-only by permissions.
    """
    args = [sys.executable, "-m", "embedfresh.jobs.train"]
    for s in sets:
        args += ["--set", s]
    if os.geteuid() != 0:
        dirs = [directory, *(p for p in directory.rglob("*") if p.is_dir())]
        modes = {d: d.stat().st_mode for d in dirs}
        for d in dirs:
            d.chmod(stat.S_IMODE(modes[d]) & ~0o222)
        try:
            return subprocess.run(
                args, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=600
            )
        finally:
            for d in dirs:
                d.chmod(stat.S_IMODE(modes[d]))
    if shutil.which("unshare") is None or not _read_only_mount_works(directory):
        pytest.skip("running as root without mount namespaces: cannot make a read-only root")
    script = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && shift && exec "$@"'
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", str(directory), *args],
        cwd=ROOT,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_read_only_root(root):
    before = snapshot(_dir(root))
    result = run_on_read_only_root(
        _dir(root),
        f"artifact_root={root}",
        f"run_id={RUN}",
        START,
        "epochs=1",
        "checkpoint_every=3",
        "init=base",
    )
    assert_one_line_error(result, "train", "artifact root", root, "read-only")
    assert_nothing_published(root, before)


# -- versions are immutable; evaluation needs a version ------------------------------------


def test_second_run_cannot_republish_a_version_with_another_config(root):
    first = run_job(
        "train", f"artifact_root={root}", "run_id=first", START, "max_steps=2", "init=base"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    store = ArtifactStore(root)
    bare_release(store, "tiny", "first")
    before = snapshot(_dir(root))
    assert "models/tiny/versions/first/COMMIT" in before
    assert "models/tiny/registry.json" in before

    second = run_job(
        "train",
        f"artifact_root={root}",
        "run_id=second",
        "version=first",
        START,
        "max_steps=3",
        "init=base",
    )
    assert_one_line_error(
        second, "train", "model version first", "already exists from another configuration"
    )
    assert_nothing_published(root, before, run_id="second")
    assert Registry(store, "tiny").production_version() == "first"


def test_evaluate_a_version_that_does_not_exist(root):
    before = snapshot(_dir(root))
    result = run_job("evaluate", f"artifact_root={root}", "run_id=ev", "version=nope")
    assert_one_line_error(result, "evaluate", "models/tiny/versions/nope", "does not exist")
    assert not (_dir(root) / "runs/tiny/ev/reports/eval.json").exists()
    assert snapshot(_dir(root)) == before


# -- registry, checkpoints, eval rows, corpus, credentials ----------------------------------


def _corrupt_registry(root: str) -> None:
    path = _dir(root) / "models/tiny/registry.json"
    path.write_bytes(path.read_bytes()[:40])  # cut mid-document, as a torn write would


@pytest.mark.parametrize(
    "job, sets",
    [
        ("train", [f"run_id={RUN}", START, "init=production"]),
        ("gate", [f"run_id={PROD}"]),
    ],
)
def test_corrupted_registry_is_refused_never_reset(root, job, sets):
    if job == "gate":  # the gate reads the candidate's eval report before the registry
        evaluated = run_job("evaluate", f"artifact_root={root}", *sets, f"version={PROD}")
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    _corrupt_registry(root)
    before = snapshot(_dir(root))
    result = run_job(job, f"artifact_root={root}", *sets)
    assert_one_line_error(result, job, "registry", "is corrupted", "never reset automatically")
    assert snapshot(_dir(root)) == before


def test_checkpoint_of_another_model_config_is_refused(root):
    """A run id reused with other hyperparameters: its checkpoints are not resumed."""
    first = run_job(
        "train",
        f"artifact_root={root}",
        "run_id=reused",
        START,
        "max_steps=9",
        "checkpoint_every=4",
        "init=base",
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert (_dir(root) / "runs/tiny/reused/checkpoints/step-00000008/COMMIT").exists()
    before = snapshot(_dir(root))
    result = run_job(
        "train",
        f"artifact_root={root}",
        "run_id=reused",
        "version=reused-2",
        START,
        "max_steps=9",
        "checkpoint_every=4",
        "init=base",
        "learning_rate=0.5",
    )
    assert_one_line_error(
        result, "train", "step-00000008", "written by another configuration", "start a new run id"
    )
    assert snapshot(_dir(root)) == before


def test_gate_with_zero_eval_rows(root):
    evaluated = run_job("evaluate", f"artifact_root={root}", f"run_id={RUN}", f"version={PROD}")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    reports = _dir(root) / f"runs/tiny/{RUN}/reports"
    for path in reports.glob("eval.*.parquet"):
        pq.write_table(pq.read_table(path).slice(0, 0), path)
    before = snapshot(_dir(root))
    result = run_job("gate", f"artifact_root={root}", f"run_id={RUN}", f"version={PROD}")
    assert_one_line_error(result, "gate", "candidate outcomes have no rows")
    # The gate evaluates its reference before it reads the candidate's outcomes: that
    # report is new; the registry, the versions and the embeddings are untouched.
    after = snapshot(_dir(root))
    assert {k: after.get(k) for k in before} == before
    new = sorted(after.keys() - before.keys())
    assert all(k.startswith(f"runs/tiny/{RUN}/reports/eval-reference.") for k in new), new
    assert not (reports / "gate.json").exists()


def test_evaluate_an_empty_eval_split(root):
    (part,) = (_dir(root) / "datasets/products/eval").rglob("*.parquet")
    pq.write_table(pq.read_table(part).slice(0, 0), part)
    before = snapshot(_dir(root))
    result = run_job("evaluate", f"artifact_root={root}", f"run_id={RUN}", f"version={PROD}")
    assert_one_line_error(result, "evaluate", "empty eval split", "has no rows")
    assert snapshot(_dir(root)) == before


def test_release_without_a_gate_report(root):
    before = snapshot(_dir(root))
    result = run_job("release", f"artifact_root={root}", f"run_id={RUN}")
    assert_one_line_error(result, "release", "no gate report", "run the gate job first")
    assert snapshot(_dir(root)) == before


#: The release side's steps out of order or on what is not there: each names the command
#: that makes what it lacks. The store is not touched and the index is never opened.
RELEASE_CASES = {
    "load-without-verified-embeddings": (
        "index_load",
        [f"version={PROD}", "corpus=nope"],
        ["no verified embeddings", "embed_verify --set model=tiny --set version=prod"],
    ),
    "check-without-verified-embeddings": (
        "search_check",
        [f"version={PROD}"],
        ["_MANIFEST.json", "embed and verify them first"],
    ),
    "release-of-an-unknown-version": (
        "release",
        ["version=nope", "action=promote_anyway", "reason=test", "corpora=[]"],
        ["models/tiny/versions/nope", "not committed"],
    ),
    "rollback-to-no-release": (
        "rollback",
        ["to_release=nope", "reason=test"],
        ["cannot roll tiny back to release nope", "kept before it"],
    ),
    "repeated-corpora": ("release", ['corpora=["a","a"]'], ["corpora must not repeat"]),
    "ef-construction-below-2m": (
        "index_load",
        ["hnsw_m=32", "hnsw_ef_construction=40"],
        ["hnsw_ef_construction (40) must be at least 2 x hnsw_m (64)"],
    ),
    "memory-not-a-size": (
        "index_load",
        ["maintenance_work_mem=lots"],
        ["maintenance_work_mem", "PostgreSQL memory size"],
    ),
}


@pytest.mark.parametrize("case", list(RELEASE_CASES))
def test_release_side_bad_input(root, case):
    job, sets, words = RELEASE_CASES[case]
    before = snapshot(_dir(root))
    result = run_job(job, f"artifact_root={root}", f"run_id={RUN}", *sets)
    assert_one_line_error(result, job, *words)
    assert snapshot(_dir(root)) == before


def _write_corpus(root: str, name: str, ids: list[int], texts: list[str]) -> None:
    path = _dir(root) / f"corpora/{name}/part-00000.parquet"
    path.parent.mkdir(parents=True)
    table = pa.table({"id": pa.array(ids, pa.int64()), "text": pa.array(texts, pa.string())})
    pq.write_table(table, path)


EMBED_CASES = {
    "duplicate-corpus-ids": (
        ["corpus=dups"],
        lambda r: _write_corpus(r, "dups", [1, 2, 2, 3], ["a", "b", "c", "d"]),
        ["corpora/dups/part-00000.parquet", "1 duplicate ids", "[2]"],
    ),
    "unknown-corpus": (["corpus=nope"], None, ["corpora/nope"]),
    "unknown-version": (["version=nope"], None, ["models/tiny/versions/nope"]),
    "unknown-backend": (["backend=tpu"], None, ["unknown backend 'tpu'"]),
}


@pytest.mark.parametrize("case", list(EMBED_CASES))
def test_embed_bad_input(root, case):
    sets, prepare, words = EMBED_CASES[case]
    if prepare is not None:
        prepare(root)
    before = snapshot(_dir(root))
    result = run_job("embed", f"artifact_root={root}", f"run_id={RUN}", f"version={PROD}", *sets)
    assert_one_line_error(result, "embed", *words)
    assert snapshot(_dir(root)) == before


def test_over_long_text_is_truncated_and_counted(root):
    """Not an error: a text longer than the model's window is cut to it (as in
    training), and the report counts how many were."""
    long_text = " ".join(["wireless noise cancelling headphones"] * 20_000)
    _write_corpus(root, "long", [1, 2], [long_text, "usb cable"])
    before = snapshot(_dir(root))
    result = run_job(
        "embed", f"artifact_root={root}", f"run_id={RUN}", f"version={PROD}", "corpus=long"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((_dir(root) / f"runs/tiny/{RUN}/reports/embed-long.json").read_text())
    assert report["truncated"] == 1, report
    after = snapshot(_dir(root))
    assert {k: after[k] for k in before} == before  # only new files, nothing replaced
    assert all(
        k.startswith(("embeddings/tiny/prod/long/", f"runs/tiny/{RUN}/"))
        for k in after.keys() - before.keys()
    )


def test_missing_s3_credentials(s3_root):
    """No key in the environment, no shared credentials file, no instance metadata."""
    import boto3

    bucket = s3_root.removeprefix("s3://").split("/")[0]
    s3 = boto3.client("s3")
    listing = lambda: {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}  # noqa: E731
    before = listing()
    env = job_env(
        {
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
            "AWS_CONFIG_FILE": "/nonexistent/config",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "embedfresh.jobs.train"]
    for s in (f"artifact_root={s3_root}", f"run_id={RUN}", START):
        cmd += ["--set", s]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert_one_line_error(result, "train", "no AWS credentials", s3_root)
    assert listing() == before


# -- invalid Params: refused by Airflow before a run (and a job) exists -------------------


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("epochs", 0, "less than the minimum of 1"),
        ("nproc", "two", "'two' is not of type 'integer'"),
        ("backend", "tpu", "'tpu' is not one of"),
    ],
)
def test_invalid_dag_params_are_refused_before_a_run(name, value, words):
    """The trigger form and the REST API validate the Params of
    ``embedding_model_refresh`` against their schema; the jobs validate again."""
    import copy

    from airflow.sdk.definitions.param import ParamValidationError

    from dags.embedding_model_refresh import dag

    params = copy.deepcopy(dag.params)
    with pytest.raises(ParamValidationError, match=f"Invalid input for param {name}") as info:
        params.update({name: value})
    assert words in str(info.value)
