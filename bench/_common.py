"""Helpers shared by the bench scripts: machine facts, medians of interleaved repeats, the
matmul peak, Markdown tables and the dated section appended to ``docs/BENCHMARKS.md``.

Bench scripts run on demand, never in CI. Each prints its section and appends it to
``docs/BENCHMARKS.md`` (other engineers append theirs to the same file: append only).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "docs" / "BENCHMARKS.md"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Said in every section: the figures were taken on a shared machine.
NOISY = (
    "measured on a shared 2-core box while other engineers ran tests: variants are "
    "interleaved and medians reported; the lead reruns on a quiet machine"
)


def bench_env(threads: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a bench subprocess: the repo importable, offline, ``threads``
    intra-op threads (OpenMP and MKL)."""
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PJRT_DEVICE=env.get("PJRT_DEVICE", "CPU"),
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    return env


def generate_data(
    root: str,
    day: dt.date,
    train_rows: int,
    eval_rows: int = 64,
    corpus_rows: int = 64,
    shard_rows: int = 64,
) -> None:
    """One day of the generated ``products`` data set (train partition, eval split and
    corpus) under the artifact root ``root``, as ``python -m embedfresh.jobs.generate_data`` writes
    it."""
    from embedfresh.core.storage import ArtifactStore  # noqa: PLC0415
    from embedfresh.ml.data.generate import write_dataset  # noqa: PLC0415

    write_dataset(
        ArtifactStore(root),
        "products",
        0,
        day,
        1,
        train_rows,
        eval_rows,
        "products",
        corpus_rows,
        shard_rows,
    )


def cpu_model() -> str:
    from embedfresh.core import cpuinfo  # noqa: PLC0415 - after ROOT is on sys.path

    return cpuinfo.field("model name") or platform.processor() or "unknown CPU"


def cpu_isa() -> str:
    """The vector ISA torch dispatches to, plus the matrix and dot-product extensions it
    finds (AMX, AVX512-BF16, AVX512-VNNI): fp32 GEMM rates differ ~2x between AVX2 and
    AVX-512 parts, and bf16 / int8 ones ~5x between parts with and without AMX."""
    import torch  # noqa: PLC0415 - only where a bench runs

    cpu = torch._C._cpu
    probes = (
        ("AMX", getattr(cpu, "_is_amx_tile_supported", None)),
        ("AVX512-BF16", getattr(cpu, "_is_avx512_bf16_supported", None)),
        ("AVX512-VNNI", getattr(cpu, "_is_avx512_vnni_supported", None)),
    )  # private probes: torch 2.11 dropped the AMX one
    extras = [name for name, probe in probes if probe is not None and probe()]
    return " + ".join([torch.backends.cpu.get_cpu_capability(), *extras])


def machine() -> str:
    """One line: cores usable, CPU model, Python and torch versions, load average."""
    import torch  # noqa: PLC0415 - only where a bench runs

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    isa = cpu_isa()
    return (
        f"nproc {len(os.sched_getaffinity(0))}, {cpu_model()} ({isa}), Python "
        f"{platform.python_version()}, torch {torch.__version__}, load average at start {load}"
    )


def command_line(threads: int | None = None) -> str:
    """How this script was invoked, as a copy-pasteable command from the repo root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script_text = str(script.relative_to(ROOT))
    except ValueError:
        script_text = str(script)
    prefix = f"OMP_NUM_THREADS={threads} " if threads is not None else ""
    return f"{prefix}.venv/bin/python {shlex.join([script_text, *sys.argv[1:]])}"


def interleaved(variants: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Call every variant once per round, ``repeats`` rounds, rotating the order each
    round, so that drifting load on a shared machine hits every variant alike. Each
    callable returns its own measurement (e.g. seconds); all of them are kept."""
    names = list(variants)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            out[name].append(variants[name]())
    return out


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


class MatmulPeak:
    """The practical matmul peak of this machine: GFLOP/s of an ``n x n`` matmul
    (``2 n^3`` FLOPs) in ``dtype`` on ``device`` (fp32 on the CPU with the current torch
    thread count by default; a GPU bench asks for bf16 on ``cuda``). Each call measures
    once (the median of ``per_call`` products), so a bench can interleave it with what
    it measures and set both side by side on a machine whose load drifts."""

    def __init__(
        self, n: int = 2048, per_call: int = 3, device: str = "cpu", dtype: str = "float32"
    ) -> None:
        import torch  # noqa: PLC0415 - only where a bench runs

        self.n, self.per_call = n, per_call
        kind = getattr(torch, dtype)
        self.a = torch.randn(n, n, device=device, dtype=kind)
        self.b = torch.randn(n, n, device=device, dtype=kind)
        self.mm = torch.mm
        self.sync = device_sync(device)
        self.mm(self.a, self.b)  # warm-up: thread pool, allocator, GPU kernels
        self.sync()

    def __call__(self) -> float:
        rates = []
        for _ in range(self.per_call):
            self.sync()
            started = time.perf_counter()
            self.mm(self.a, self.b)
            self.sync()
            rates.append(2 * self.n**3 / (time.perf_counter() - started) / 1e9)
        return median(rates)


def device_sync(device: str) -> Callable[[], None]:
    """A call that waits for the device's queued work (a no-op on the CPU), so wall
    clocks around GPU work time the work and not its launch."""
    if not device.startswith("cuda"):
        return lambda: None
    import torch  # noqa: PLC0415 - only where a bench runs

    return torch.cuda.synchronize


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: int = 1) -> str:
    """A Markdown table; columns from index ``right`` on are right-aligned (numbers)."""
    align = ["---" if i < right else "---:" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def section(title: str, bullets: Sequence[str], body: Sequence[str] = ()) -> str:
    """A dated ``##`` section: bullets (command, machine, notes), then tables/paragraphs."""
    lines = [f"## {title} ({dt.date.today().isoformat()})", ""]
    lines += [f"- {b}" for b in bullets]
    for block in body:
        lines += ["", block]
    return "\n".join(lines) + "\n"


def publish(text: str, output: Path | None = BENCHMARKS) -> None:
    """Print a section and append it to ``output`` (``None``: print only). Appending
    never rewrites what other scripts wrote before."""
    print(text, flush=True)
    if output is None:
        return
    head = "" if output.exists() else "# Benchmarks\n\n"
    with output.open("a") as f:
        f.write(head + "\n" + text)
