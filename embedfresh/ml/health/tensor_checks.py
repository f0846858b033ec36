"""Per-device checks: the device is there, its arithmetic agrees with a float64
reference on the host, NaN/Inf behave, and its memory holds what was written.

Inputs are drawn on the host from a fixed seed, rounded to float32, and the
reference is computed in float64 from those same float32 values, so the measured
error is the device op's own. Errors are normwise: ``max|out - ref| / scale`` with
``scale = max|ref|`` (for matmul ``max(|a| @ |b|)``, the bound that stays meaningful
under cancellation).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from embedfresh.ml.backends import Backend
from embedfresh.ml.health.report import Check, check, guarded

SEED = 1234


def device_count(backend: Backend) -> int:
    """Devices this node exposes to the backend (cpu counts as one)."""
    if backend.device.type == "cuda":
        return torch.cuda.device_count()
    if backend.name in ("xla", "neuron"):
        import torch_xla.runtime as xr  # noqa: PLC0415 - only on xla backends

        return xr.global_runtime_device_count()
    return 1


def check_devices(backend: Backend, expected: int | None) -> Check:
    count = device_count(backend)
    if expected is None:
        ok, want = count >= 1, "at least 1"
    else:
        ok, want = count == expected, str(expected)
    return check(
        "device_count",
        ok,
        f"{count} {backend.name} device(s) visible, expected {want}",
        count=count,
        expected=expected,
    )


def _inputs(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(torch.float32)


def _compare(
    name: str, out: torch.Tensor, ref: torch.Tensor, rtol: float, scale: float | None = None
) -> Check:
    out64 = out.detach().to("cpu", torch.float64)
    if out64.shape != ref.shape:
        shape = list(out64.shape)
        return check(name, False, f"result shape {shape}, expected {list(ref.shape)}")
    if not bool(torch.isfinite(out64).all()):
        bad = int((~torch.isfinite(out64)).sum())
        return check(name, False, f"{bad} non-finite value(s) in a finite computation")
    scale = float(ref.abs().max()) if scale is None else scale
    err = float((out64 - ref).abs().max()) / max(scale, 1e-300)
    ok = err <= rtol
    verdict = "within" if ok else "EXCEEDS"
    return check(
        name, ok, f"relative error {err:.3g} {verdict} tolerance {rtol:g}", rel_err=err,
        tolerance=rtol,
    )  # fmt: skip


def check_matmul(backend: Backend, n: int, rtol: float) -> Check:
    a, b = _inputs((n, n), SEED), _inputs((n, n), SEED + 1)
    out = torch.matmul(a.to(backend.device), b.to(backend.device))
    ref = a.double() @ b.double()
    scale = float((a.double().abs() @ b.double().abs()).max())
    result = _compare("tensor.matmul", out, ref, rtol, scale)
    result["shape"] = [n, n]
    return result


REDUCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sum": torch.sum,
    "mean": torch.mean,
    # torch.max, not torch.amax: torch-xla 2.9 returns amax(x) without dims unreduced.
    "max": torch.max,
    "norm": torch.linalg.vector_norm,
}

ELEMENTWISE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "exp": lambda x, y: torch.exp(x),
    "tanh": lambda x, y: torch.tanh(x),
    "sqrt_abs": lambda x, y: torch.sqrt(torch.abs(x)),
    "mul_add": lambda x, y: x * y + x,
}


def check_reduction(backend: Backend, name: str, n: int, rtol: float) -> Check:
    x = _inputs((n * n,), SEED + 2)
    op = REDUCTIONS[name]
    out = op(x.to(backend.device))
    ref = op(x.double())
    # A sum cancels: scale by the sum of magnitudes, the bound of its rounding error.
    scale = float(x.double().abs().sum()) / (x.numel() if name == "mean" else 1)
    return _compare(f"tensor.{name}", out, ref, rtol, scale if name in ("sum", "mean") else None)


def check_elementwise(backend: Backend, name: str, n: int, rtol: float) -> Check:
    x, y = _inputs((n * n,), SEED + 3), _inputs((n * n,), SEED + 4)
    op = ELEMENTWISE[name]
    out = op(x.to(backend.device), y.to(backend.device))
    return _compare(f"tensor.{name}", out, op(x.double(), y.double()), rtol)


def check_nan_inf(backend: Backend) -> Check:
    """The device produces NaN/Inf where IEEE says so and ``isfinite`` finds exactly
    the planted ones: a device that hides non-finite values would let a diverging
    training run look healthy."""
    x = torch.ones(1024)
    planted = [3, 500, 1023]
    x[3], x[500], x[1023] = float("nan"), float("inf"), float("-inf")
    dev = x.to(backend.device)
    found = torch.nonzero(~torch.isfinite(dev)).flatten().cpu().tolist()
    special = torch.tensor([1.0, 0.0, -1.0]).to(backend.device) / torch.zeros(3).to(backend.device)
    got = special.cpu()
    ieee = math.isinf(got[0]) and got[0] > 0 and math.isnan(got[1]) and got[2] < 0
    ok = found == planted and ieee
    detail = (
        f"isfinite found {found} (planted {planted}); 1/0, 0/0, -1/0 gave {[float(v) for v in got]}"
    )
    return check("tensor.nan_inf", ok, detail, found=found, planted=planted)


def check_memory(backend: Backend, nbytes: int) -> Check:
    """Allocate ``nbytes`` on the device, fill it with a known pattern, read a digest
    back (a sum that any flipped value changes) and free it."""
    n = max(1, nbytes // 4)
    buf = torch.arange(n, dtype=torch.int32, device=backend.device).remainder_(251)
    got = int(buf.to(torch.int64).sum().cpu())
    full, rest = divmod(n, 251)
    want = full * (250 * 251 // 2) + rest * (rest - 1) // 2
    extra = {}
    if backend.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(backend.device)
        extra = {"device_free_bytes": free, "device_total_bytes": total}
    del buf
    return check(
        "memory_alloc",
        got == want,
        f"{n * 4} bytes allocated, digest {got} (expected {want})",
        bytes=n * 4,
        **extra,
    )


def run_all(backend: Backend, size: int, rtol: float, memory_bytes: int) -> list[Check]:
    """Every tensor check, each guarded so one fault does not hide the others."""
    checks = [guarded("tensor.matmul", lambda: check_matmul(backend, size, rtol))]
    for name in REDUCTIONS:
        checks.append(
            guarded(f"tensor.{name}", lambda n=name: check_reduction(backend, n, size, rtol))
        )
    for name in ELEMENTWISE:
        checks.append(
            guarded(f"tensor.{name}", lambda n=name: check_elementwise(backend, n, size, rtol))
        )
    checks.append(guarded("tensor.nan_inf", lambda: check_nan_inf(backend)))
    checks.append(guarded("memory_alloc", lambda: check_memory(backend, memory_bytes)))
    return checks
