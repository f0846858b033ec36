"""The Neuron host tools: ``neuron-ls -j`` (which devices and cores the node has) and
``nccom-test`` (collectives on the NeuronCores, with ``--check``), output parsed.

Formats, from the Neuron documentation (``tools/neuron-sys-tools/neuron-ls.rst`` and
``nccom-test.rst`` in aws-neuron/aws-neuron-sdk) and real captures (samples in
``tests/fixtures/neuron/``):

- ``neuron-ls -j``: a JSON array, one object per device: ``neuron_device`` (int),
  ``bdf``, ``nc_count``, ``memory_size`` (bytes), ``connected_to`` (list or null),
  ``neuroncore_ids``, ``neuron_processes``. Neuron 2.34 replaces it with
  ``--output-format json``; this parser then fails with a clear error rather than
  misreading it.
- ``nccom-test``: a table ``size(B) count(elems) type time(us) algbw(GB/s)
  busbw(GB/s)`` (bandwidths in GiB/s), then ``Avg bus bandwidth: <x>GB/s``. A failed
  size prints ``<size> Failure running neuron-bench - log file ...`` in its row and
  ``N errors found - test failed`` at the end; a host problem prints one line before
  any table (``Neuron DKMS Driver is not running! ...``).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from typing import Any

from embedfresh.core.config import HealthConfig
from embedfresh.ml.health.report import Check, check, guarded

log = logging.getLogger("embedfresh.jobs.health.neuron")

NEURON_LS = "neuron-ls"
NCCOM_TEST = "nccom-test"
NCCOM_COLUMNS = ["size(B)", "count(elems)", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)"]
_AVG = re.compile(r"^Avg bus bandwidth:\s*([0-9.]+)\s*GB/s$")
_FAILURE = re.compile(r"error|fail|not running", re.IGNORECASE)


class NeuronOutputError(ValueError):
    """A Neuron tool printed something this parser cannot read as its documented format."""


def _int_field(entry: dict[str, Any], key: str, index: int) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise NeuronOutputError(
            f"neuron-ls device #{index}: {key!r} must be an integer, got {value!r}"
        )
    return value


def parse_neuron_ls(text: str) -> list[dict[str, Any]]:
    """Devices listed by ``neuron-ls -j``, normalised.

    :raises NeuronOutputError: not JSON, not an array of device objects, or a device
        without ``neuron_device``/``nc_count``/``memory_size``.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        head = text.strip()[:80]
        raise NeuronOutputError(f"neuron-ls -j did not print JSON ({e}): {head!r}") from None
    if not isinstance(data, list):
        raise NeuronOutputError(
            f"neuron-ls -j printed a JSON {type(data).__name__}, expected an array of devices "
            "(Neuron 2.34+ replaced -j with --output-format json)"
        )
    if not data:
        raise NeuronOutputError("neuron-ls -j listed no Neuron device")
    devices = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise NeuronOutputError(f"neuron-ls device #{i} is not an object: {entry!r}")
        cores = entry.get("neuroncore_ids")
        connected = entry.get("connected_to")
        if connected is not None and not isinstance(connected, list):
            raise NeuronOutputError(f"neuron-ls device #{i}: connected_to is {connected!r}")
        devices.append(
            {
                "neuron_device": _int_field(entry, "neuron_device", i),
                "nc_count": _int_field(entry, "nc_count", i),
                "memory_size": _int_field(entry, "memory_size", i),
                "bdf": entry.get("bdf"),
                "connected_to": connected or [],
                "neuroncore_ids": cores if isinstance(cores, list) else None,
                "processes": len(entry.get("neuron_processes") or []),
            }
        )
    return devices


def core_count(devices: list[dict[str, Any]]) -> int:
    """NeuronCores usable as ranks: the listed core ids (logical cores on trn2),
    else ``nc_count`` per device."""
    return sum(len(d["neuroncore_ids"]) if d["neuroncore_ids"] else d["nc_count"] for d in devices)


def _number(token: str, what: str, line: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise NeuronOutputError(
            f"nccom-test: {what} {token!r} is not a number in {line!r}"
        ) from None


def parse_nccom_test(text: str) -> dict[str, Any]:
    """Rows, average bus bandwidth and reported errors of one ``nccom-test`` run.

    :raises NeuronOutputError: no table header and no recognised error line, or a row
        that is neither six numbers/type columns nor a documented failure.
    """
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise NeuronOutputError("nccom-test printed nothing")
    header = next((i for i, ln in enumerate(lines) if ln.split() == NCCOM_COLUMNS), None)
    if header is None:
        if any(_FAILURE.search(ln) for ln in lines):  # the documented "immediate" failure
            return {"rows": [], "avg_busbw_gibps": None, "errors": lines, "failed": True}
        head = " | ".join(lines[:2])
        raise NeuronOutputError(
            f"nccom-test printed no result table (header {' '.join(NCCOM_COLUMNS)!r}): {head!r}"
        )
    rows: list[dict[str, Any]] = []
    errors: list[str] = [ln for ln in lines[:header]]
    avg = None
    for line in lines[header + 1 :]:
        if m := _AVG.match(line):
            avg = float(m.group(1))
            continue
        if _FAILURE.search(line):  # a failed size's row, "N errors found - test failed"
            errors.append(line)
            continue
        cols = line.split()
        if len(cols) != len(NCCOM_COLUMNS):
            raise NeuronOutputError(
                f"nccom-test row has {len(cols)} columns, expected {len(NCCOM_COLUMNS)}: {line!r}"
            )
        rows.append(
            {
                "size_bytes": int(_number(cols[0], "size", line)),
                "count": int(_number(cols[1], "count", line)),
                "type": cols[2],
                "time_us": _number(cols[3], "time", line),
                "algbw_gibps": _number(cols[4], "algbw", line),
                "busbw_gibps": _number(cols[5], "busbw", line),
            }
        )
    if not rows and not errors:
        raise NeuronOutputError("nccom-test printed a header but no result row")
    return {"rows": rows, "avg_busbw_gibps": avg, "errors": errors, "failed": bool(errors)}


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise FileNotFoundError(f"{argv[0]} not found on PATH (aws-neuronx-tools installed?)")
    log.info("running %s", " ".join(argv))
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _neuron_ls(cfg: HealthConfig, out: dict[str, Any]) -> Check:
    proc = _run([NEURON_LS, "-j"], cfg.tool_timeout_s)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-300:]
        return check("neuron_ls", False, f"neuron-ls -j exited {proc.returncode}: {tail}")
    devices = parse_neuron_ls(proc.stdout)
    out["neuron_ls"] = devices
    n, cores = len(devices), core_count(devices)
    want = cfg.expected_neuron_devices
    ok = want is None or n == want
    detail = f"{n} Neuron device(s), {cores} NeuronCore(s)" + (
        "" if want is None else f", expected {want} device(s)"
    )
    return check("neuron_ls", ok, detail, devices=n, cores=cores, expected=want)


def _nccom(cfg: HealthConfig, op: str, ranks: int, out: dict[str, Any]) -> Check:
    name = f"nccom_test.{op}"
    argv = [
        NCCOM_TEST, "-r", str(ranks), "-b", str(cfg.nccom_min_bytes), "-e",
        str(cfg.nccom_max_bytes), "-f", str(cfg.nccom_step_factor), "-d", "fp32", "--check", op,
    ]  # fmt: skip
    proc = _run(argv, cfg.tool_timeout_s)
    parsed = parse_nccom_test(proc.stdout)
    out.setdefault("nccom_test", {})[op] = {"argv": argv, "exit_code": proc.returncode, **parsed}
    problems = list(parsed["errors"])
    if proc.returncode != 0:
        problems.append(f"exit code {proc.returncode}")
    largest = max(parsed["rows"], key=lambda r: r["size_bytes"], default=None)
    busbw = largest["busbw_gibps"] if largest else None
    floor = cfg.nccom_min_busbw_gbps
    if floor is not None and (busbw is None or busbw < floor):
        problems.append(f"busbw {busbw} GiB/s at the largest size is below the floor {floor}")
    detail = "; ".join(problems) if problems else (
        f"{len(parsed['rows'])} size(s) checked on {ranks} ranks, busbw {busbw} GiB/s at "
        f"{largest['size_bytes']} B"
    )  # fmt: skip
    return check(name, not problems, detail, ranks=ranks, busbw_gibps=busbw)


def run(cfg: HealthConfig) -> tuple[list[Check], dict[str, Any]]:
    """``neuron-ls -j`` then one ``nccom-test --check`` per configured op: their checks
    and parsed outputs. Missing tools and unreadable output fail a check (exit 4): on
    a Neuron host they are part of what must work."""
    out: dict[str, Any] = {}
    checks = [guarded("neuron_ls", lambda: _neuron_ls(cfg, out))]
    ranks = cfg.nccom_ranks or (core_count(out["neuron_ls"]) if "neuron_ls" in out else 0)
    for op in cfg.nccom_ops:
        if ranks < 2:
            why = f"{ranks} NeuronCore(s) known" if "neuron_ls" in out else "neuron-ls failed"
            detail = f"not run: needs at least 2 ranks ({why}; nccom_ranks sets them)"
            checks.append(check(f"nccom_test.{op}", False, detail))
            continue
        checks.append(guarded(f"nccom_test.{op}", lambda o=op: _nccom(cfg, o, ranks, out)))
    return checks, out
