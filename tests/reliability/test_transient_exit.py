"""The exit-code contract for storage faults: a transient fault that escapes the
artifact store's own wrappers (a Parquet reader pulling bytes from S3, a dropped
connection) still ends the job with exit 75 and one clear line, while any other
exception stays a crash with its traceback."""

from __future__ import annotations

import pytest

from embedfresh.core import cli
from embedfresh.core.config import JobConfig
from embedfresh.core.exit_codes import BadInputError, ExitCode, TransientError


@pytest.fixture(autouse=True)
def _keep_test_logging(monkeypatch):
    monkeypatch.setattr(cli, "configure_logging", lambda: None)


def _run(exc: BaseException, capsys) -> tuple[int, str, str]:
    def job(cfg: JobConfig) -> dict:
        raise exc

    code = cli.run_job("probe", JobConfig, job, ["--set", "run_id=r1"])
    out, err = capsys.readouterr()
    return code, out, err


def raised_from(outer: BaseException, cause: BaseException) -> BaseException:
    """``outer`` as raised by ``raise outer from cause`` inside ``except cause``."""
    try:
        try:
            raise cause
        except BaseException as inner:
            raise outer from inner
    except BaseException as e:
        return e


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(TransientError("artifact store s3://b unreachable"), id="transient-error"),
        pytest.param(ConnectionResetError(104, "Connection reset by peer"), id="reset"),
        pytest.param(
            raised_from(OSError("error reading the Parquet footer"), ConnectionResetError()),
            id="reader-error-caused-by-a-reset",
        ),
    ],
)
def test_transient_faults_exit_75_with_one_line(exc, capsys):
    code, out, err = _run(exc, capsys)
    assert code == ExitCode.TRANSIENT == 75
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("probe: error: "), err
    assert "Traceback" not in err


def test_bad_input_keeps_exit_2(capsys):
    code, _, err = _run(BadInputError("wrong schema in x"), capsys)
    assert code == ExitCode.BAD_INPUT
    assert err.strip() == "probe: error: wrong schema in x"


def test_a_bug_stays_a_crash():
    def job(cfg: JobConfig) -> dict:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        cli.run_job("probe", JobConfig, job, ["--set", "run_id=r1"])


def test_a_collective_that_lost_its_peer_is_transient_and_nothing_else_is():
    """Gloo's transport errors and c10d's DistNetworkError (also as the cause of another
    error) mean another host went away: exit 75. A plain RuntimeError stays a crash."""
    from embedfresh.core.cli import lost_peer

    reset = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:538] Read error "
        "[10.213.0.2]:40123: Connection reset by peer"
    )
    assert lost_peer(reset)
    DistNetworkError = type("DistNetworkError", (RuntimeError,), {})
    assert lost_peer(DistNetworkError("connection to the store failed"))
    try:
        try:
            raise reset
        except RuntimeError as e:
            raise ValueError("step 4 failed") from e
    except ValueError as wrapped:
        assert lost_peer(wrapped)
    assert not lost_peer(RuntimeError("CUDA error: an illegal memory access"))
    assert not lost_peer(ValueError("gloo/transport/ in a message of another type"))
    assert not lost_peer(None)
