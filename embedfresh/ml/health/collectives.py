"""Collectives across all ranks: all-reduce, all-gather and reduce-scatter at several
sizes, each result compared exactly with what the ranks contributed, with algorithm
and bus bandwidth (nccl-tests' definitions).

Under torchrun the ranks join one process group (gloo on cpu, nccl on cuda, xla on
xla/neuron); a gloo group beside it carries the report's Python objects to rank 0.
Without torchrun the world is one rank: the ops run on a one-rank group where the
backend has one (cpu, cuda) and the report marks them ``trivial``: nothing crossed a
link.

Contributions are small integers in float32 (exact in any summation order), so a
correct collective reproduces the expected tensor bit for bit.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from embedfresh.ml.backends import Backend
from embedfresh.ml.health.report import Check, check, guarded

#: nccl-tests' bus-bandwidth factors: busbw = algbw * factor(n).
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}
PATTERN_PERIOD = 97
GLOO_NO_REDUCE_SCATTER = "all_reduce+slice"


def bus_bandwidth(op: str, algbw: float, world_size: int) -> float:
    """Bus bandwidth of ``op`` from its algorithm bandwidth (same unit)."""
    return algbw * BUS_FACTOR[op](world_size)


def _sig(x: float) -> float:
    """``x`` to 6 significant digits (small sizes have tiny bandwidths)."""
    return float(f"{x:.6g}")


def elements_for(size_bytes: int, world_size: int) -> int:
    """float32 elements of a buffer of about ``size_bytes``, a multiple of the world
    size (each rank owns an equal chunk of all-gather output / reduce-scatter input)."""
    return max(world_size, (size_bytes // 4) // world_size * world_size)


@dataclass
class DistContext:
    """Who this process is among the ranks, and the groups it talks through."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    host: str = field(default_factory=socket.gethostname)
    launched: bool = False
    """True under torchrun (a real multi-process group)."""
    group: bool = False
    """True when a process group exists (collectives really run)."""
    meta_group: Any = None
    """gloo group for Python objects (None: the default group is already gloo)."""
    group_size: int | None = None
    """Ranks the process group itself reports; differs from ``world_size`` when the
    launched processes did not form one world (each alone: a broken rendezvous)."""

    @property
    def connected(self) -> bool:
        """True when the group holds every launched rank (objects can be exchanged)."""
        return self.group and (self.group_size or self.world_size) == self.world_size

    def gather(self, obj: Any) -> list[Any] | None:
        """``obj`` of every rank, on rank 0 (None elsewhere)."""
        if not self.connected or self.world_size == 1:
            return [obj]
        out = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.meta_group)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.connected or self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.meta_group)
        return box[0]

    def close(self) -> None:
        if self.group and dist.is_initialized():
            dist.destroy_process_group()


def launched_env() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when started by torchrun, else None."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    return (
        int(os.environ["RANK"]),
        int(os.environ["WORLD_SIZE"]),
        int(os.environ.get("LOCAL_RANK", "0")),
    )


def init(backend: Backend, timeout_s: float, one_rank_group: bool = True) -> DistContext:
    """Join the ranks (torchrun) or make the one-rank world (with a one-rank group
    when ``one_rank_group``); never raises for a missing peer before ``timeout_s``."""
    timeout = dt.timedelta(seconds=timeout_s)
    env = launched_env()
    pg = {"cpu": "gloo", "cuda": "nccl"}.get(backend.device.type, "xla")
    if env is None:
        if pg == "xla" or not one_rank_group:  # no xla group without a rendezvous
            return DistContext()
        dist.init_process_group(pg, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return DistContext(group=True)
    rank, world_size, local_rank = env
    if dist.is_initialized():  # get_backend may already have joined torchrun's group
        pass
    elif pg == "xla":
        import torch_xla.distributed.xla_backend  # noqa: F401, PLC0415 - registers "xla"

        dist.init_process_group("xla", init_method="xla://", timeout=timeout)
    else:
        dist.init_process_group(pg, timeout=timeout)
    meta = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    return DistContext(
        rank, world_size, local_rank, launched=True, group=True, meta_group=meta,
        group_size=dist.get_world_size(),
    )  # fmt: skip


def synchronize(backend: Backend) -> None:
    """Wait until the device has finished what was queued (timing needs it)."""
    if backend.device.type == "cuda":
        torch.cuda.synchronize(backend.device)
    elif backend.name in ("xla", "neuron"):
        import torch_xla.core.xla_model as xm  # noqa: PLC0415

        backend.mark_step()
        xm.wait_device_ops()


def _pattern(n: int, offset: int = 0) -> torch.Tensor:
    return (torch.arange(offset, offset + n) % PATTERN_PERIOD + 1).to(torch.float32)


class _Op:
    """One collective at one size: inputs, the exact expected output, one call."""

    def __init__(self, op: str, elems: int, ctx: DistContext, backend: Backend) -> None:
        n, r, dev = ctx.world_size, ctx.rank, backend.device
        self.op, self.ctx, self.implementation = op, ctx, "native"
        chunk = elems // n
        total = n * (n + 1) / 2  # sum over ranks of (rank + 1)
        if op == "all_reduce":
            self.src = (_pattern(elems) * (r + 1)).to(dev)
            self.out = torch.empty(elems, device=dev)
            self.expected = _pattern(elems) * total
        elif op == "all_gather":
            self.src = _pattern(chunk, offset=r * chunk).add_(r).to(dev)
            self.out = torch.empty(elems, device=dev)
            self.expected = torch.cat([_pattern(chunk, i * chunk).add_(i) for i in range(n)])
        else:  # reduce_scatter: rank r keeps chunk r of the sum
            self.src = (_pattern(elems) * (r + 1)).to(dev)
            self.out = torch.empty(chunk, device=dev)
            self.expected = _pattern(elems)[r * chunk : (r + 1) * chunk] * total

    def __call__(self) -> None:
        if not self.ctx.group:  # one rank, no group: the collective is the identity
            self._identity()
        elif self.op == "all_reduce":
            self.out.copy_(self.src)
            dist.all_reduce(self.out, op=dist.ReduceOp.SUM)
        elif self.op == "all_gather":
            dist.all_gather_into_tensor(self.out, self.src)
        elif self.implementation == "native":
            try:
                dist.reduce_scatter_tensor(self.out, self.src, op=dist.ReduceOp.SUM)
            except (RuntimeError, NotImplementedError) as e:
                # Older gloo builds have no reduce_scatter; say so rather than skip it.
                if "support" not in str(e).lower():
                    raise
                self.implementation = GLOO_NO_REDUCE_SCATTER
                self()
        else:
            full = self.src.clone()
            dist.all_reduce(full, op=dist.ReduceOp.SUM)
            chunk = self.out.numel()
            self.out.copy_(full[self.ctx.rank * chunk : (self.ctx.rank + 1) * chunk])

    def _identity(self) -> None:
        if self.op == "reduce_scatter":
            self.out.copy_(self.src[: self.out.numel()])
        else:
            self.out.copy_(self.src)

    def mismatches(self) -> int:
        return int((self.out.detach().cpu() != self.expected).sum())


def run_one(
    op: str, size_bytes: int, ctx: DistContext, backend: Backend, iters: int
) -> dict[str, Any]:
    """This rank's result for one op and size: exact check of the first call, then the
    mean time of ``iters`` back-to-back calls."""
    elems = elements_for(size_bytes, ctx.world_size)
    size = elems * 4
    name = f"{op}.{size}B"
    trivial = ctx.world_size == 1
    record: dict[str, Any] = {"op": op, "size_bytes": size, "trivial": trivial}

    def body() -> Check:
        call = _Op(op, elems, ctx, backend)
        call()
        synchronize(backend)
        wrong = call.mismatches()
        if ctx.group:
            dist.barrier(group=ctx.meta_group)
        started = time.perf_counter()
        for _ in range(iters):
            call()
        synchronize(backend)
        seconds = (time.perf_counter() - started) / iters
        record.update(seconds=seconds, implementation=call.implementation)
        what = "world size 1, nothing exchanged; " if trivial else ""
        detail = f"{what}{wrong} of {call.out.numel()} elements differ from the expected result"
        if call.implementation != "native":
            detail += f" (process group has no native {op}: measured as {call.implementation})"
        return check(name, wrong == 0, detail, mismatches=wrong, trivial=trivial)

    result = guarded(name, body)
    record.update(check=result)
    return record


def run_all(
    ops: list[str], sizes: list[int], ctx: DistContext, backend: Backend, iters: int
) -> list[dict[str, Any]]:
    return [run_one(op, size, ctx, backend, iters) for op in ops for size in sizes]


def aggregate(
    per_rank: list[list[dict[str, Any]]],
    world_size: int,
    floors: dict[str, float],
    floor_min_size: int,
) -> list[dict[str, Any]]:
    """One entry per op and size across ranks: the slowest rank's time sets the
    bandwidth (a collective finishes when its last rank does); it passes when every
    rank got the exact result and the bus bandwidth clears its floor, if any."""
    out = []
    for i, first in enumerate(per_rank[0]):
        records = [ranks[i] for ranks in per_rank]
        times = [r["seconds"] for r in records if "seconds" in r]
        bad_ranks = [rank for rank, r in enumerate(records) if not r["check"]["passed"]]
        op, size = first["op"], first["size_bytes"]
        entry: dict[str, Any] = {
            "name": f"{op}.{size}B",
            "op": op,
            "size_bytes": size,
            "world_size": world_size,
            "trivial": first["trivial"],
            "implementation": first.get("implementation", "native"),
            "time_us": None,
            "algbw_gbps": None,
            "busbw_gbps": None,
            "ranks_failed": bad_ranks,
        }
        detail = "exact on every rank" if not bad_ranks else f"wrong result on ranks {bad_ranks}"
        if len(times) == len(records) and times:
            slowest = max(times)
            algbw = size / slowest / 1e9
            entry.update(
                time_us=round(slowest * 1e6, 3),
                time_us_median_rank=round(statistics.median(times) * 1e6, 3),
                algbw_gbps=_sig(algbw),
                busbw_gbps=_sig(bus_bandwidth(op, algbw, world_size)),
            )
        floor = floors.get(op)
        low = False
        if floor is not None and size >= floor_min_size and not first["trivial"]:
            low = entry["busbw_gbps"] is None or entry["busbw_gbps"] < floor
            entry["min_busbw_gbps"] = floor
            detail += f"; busbw {entry['busbw_gbps']} GB/s vs floor {floor}"
        entry.update(passed=not bad_ranks and not low, detail=detail)
        out.append(entry)
    return out
