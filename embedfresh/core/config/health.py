"""The health job's config: what to expect of the host and how hard to test it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from embedfresh.core.config.base import JobConfig

CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter"]
NccomOp = Literal["allr", "allg", "redsct"]

#: Relative error allowed for float32 tensor ops against the float64 reference. The
#: Neuron default is looser because the compiler's ``--auto-cast all`` runs fp32
#: matmuls in bf16 (8 mantissa bits: ~4e-3 relative rounding per element).
DEFAULT_TENSOR_RTOL = {"neuron": 3e-2}
FALLBACK_TENSOR_RTOL = 1e-4

MAX_COLLECTIVE_BYTES = 1 << 30


class HealthConfig(JobConfig):
    """Health checks run before anything expensive (``python -m embedfresh.jobs.health``).

    Every field has a default that runs on the embedded CPU demo; the common fields
    (``artifact_root``, ``model``, ``run_id``, ``backend``) say where the report goes.
    """

    expected_devices: int | None = Field(default=None, ge=1)
    """Devices this node must see (cpu: 1; cuda: ``torch.cuda.device_count()``;
    xla/neuron: the PJRT runtime's device count). None: at least one."""
    expected_world_size: int | None = Field(default=None, ge=1)
    """Ranks the job must run with (torchrun's ``WORLD_SIZE``; 1 without torchrun).
    None: whatever was launched."""
    tensor_size: int = Field(default=256, ge=8, le=8192)
    """Side of the square matrices of the matmul check (vectors get ``size**2``)."""
    tensor_rtol: float | None = Field(default=None, gt=0, lt=1)
    """Largest relative error of a float32 op against float64; None picks the
    backend's default (1e-4, neuron 3e-2 for bf16 auto-cast)."""
    memory_bytes: int = Field(default=64 << 20, ge=1 << 10, le=1 << 40)
    """Bytes the device-memory check allocates, fills and reads back."""
    collectives: bool = True
    """Run the collective checks (trivial at world size 1, and reported as such)."""
    collective_ops: list[CollectiveOp] = Field(
        default_factory=lambda: ["all_reduce", "all_gather", "reduce_scatter"], min_length=1
    )
    """Collectives checked and timed across all ranks."""
    collective_sizes: list[int] = Field(
        default_factory=lambda: [4 << 10, 256 << 10, 4 << 20], min_length=1
    )
    """Buffer sizes in bytes (float32), nccl-tests convention: the all-reduce buffer,
    the all-gather output, the reduce-scatter input. Rounded down to a multiple of
    ``4 * world_size``."""
    collective_iters: int = Field(default=5, ge=1, le=1000)
    """Timed iterations per op and size (after one warm-up); the median counts."""
    min_busbw_gbps: dict[CollectiveOp, float] = Field(default_factory=dict)
    """Optional floor of bus bandwidth (GB/s, 1e9 bytes) per op, applied to sizes of
    at least ``busbw_min_size_bytes`` (small sizes measure latency, not bandwidth)."""
    busbw_min_size_bytes: int = Field(default=1 << 20, ge=1)
    """Smallest buffer size the ``min_busbw_gbps`` floors apply to."""
    dist_timeout_s: float = Field(default=300, gt=0)
    """Limit of any one collective (and of the rendezvous): a hung link fails the check."""
    neuron_tools: Literal["auto", "on", "off"] = "auto"
    """Run ``neuron-ls -j`` and ``nccom-test``: ``auto`` on the neuron backend only."""
    expected_neuron_devices: int | None = Field(default=None, ge=1)
    """Neuron devices ``neuron-ls`` must list on each node (trn1.32xlarge: 16)."""
    nccom_ops: list[NccomOp] = Field(
        default_factory=lambda: ["allr", "allg", "redsct"], min_length=1
    )
    """``nccom-test`` operations: all-reduce, all-gather, reduce-scatter."""
    nccom_ranks: int | None = Field(default=None, ge=2)
    """``nccom-test -r``; None: every NeuronCore ``neuron-ls`` lists on the node."""
    nccom_min_bytes: int = Field(default=1 << 10, ge=4)
    """``nccom-test -b``: smallest size swept, in bytes."""
    nccom_max_bytes: int = Field(default=32 << 20, ge=4)
    """``nccom-test -e``: largest size swept, in bytes."""
    nccom_step_factor: int = Field(default=8, ge=2)
    """``nccom-test -f``: factor between successive sizes."""
    nccom_min_busbw_gbps: float | None = Field(default=None, gt=0)
    """Optional floor of nccom-test's bus bandwidth at its largest size (its GB/s are
    GiB/s: 1,073,741,824 bytes)."""
    tool_timeout_s: float = Field(default=600, gt=0)
    """Limit of each ``neuron-ls`` / ``nccom-test`` run, in seconds."""

    @field_validator("collective_sizes")
    @classmethod
    def _sizes(cls, v: list[int]) -> list[int]:
        bad = [s for s in v if not 4 <= s <= MAX_COLLECTIVE_BYTES]
        if bad:
            raise ValueError(f"sizes must be 4 bytes to 1 GiB, got {bad}")
        return sorted(set(v))

    @field_validator("min_busbw_gbps")
    @classmethod
    def _floors(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: f for k, f in v.items() if not f > 0}
        if bad:
            raise ValueError(f"bandwidth floors must be > 0 GB/s, got {bad}")
        return v

    @model_validator(mode="after")
    def _nccom_range(self) -> HealthConfig:
        if self.nccom_min_bytes > self.nccom_max_bytes:
            raise ValueError("nccom_min_bytes must not exceed nccom_max_bytes")
        return self

    def rtol(self, backend: str) -> float:
        """The tensor-op tolerance in force on ``backend``."""
        if self.tensor_rtol is not None:
            return self.tensor_rtol
        return DEFAULT_TENSOR_RTOL.get(backend, FALLBACK_TENSOR_RTOL)

    def run_neuron_tools(self, backend: str) -> bool:
        return self.neuron_tools == "on" or (self.neuron_tools == "auto" and backend == "neuron")
