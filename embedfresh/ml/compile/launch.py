"""The launch a compile job runs under, and its trial's launch: the same as training's.

The DAG starts ``compile`` exactly as it starts ``train``: one process, or torchrun
(:mod:`embedfresh.jobs.launch`) with ``nproc_per_node`` processes per node. Both key the
compile cache with the launch's world size (:func:`launch_world_size`), and the trial
traces the graphs of that launch:

- ``torch.compile``: every rank of the compile job trains its shard of the trial, data
  parallel as train does, in the process group :func:`join` opens; rank 0 alone writes.
- ``xla-trace`` and ``neuron_parallel_compile``: the trial is a subprocess, started by
  the first rank of each node under the same launch as training
  (:meth:`Launch.trial_command`), which ``neuron_parallel_compile`` wraps
  (``neuron_parallel_compile torchrun --nproc_per_node=N ...`` in the Neuron docs); the
  other ranks wait for rank 0 in a gloo group, touching no device.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: Variables torchrun sets for its workers. A launch started by a worker (the trial's)
#: must not inherit them: its own launcher sets them for its own workers.
TORCHRUN_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
TORCHRUN_ENV_PREFIX = "TORCHELASTIC_"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = (env.get(name) or "").strip()
    return int(value) if value else default


@dataclass(frozen=True)
class Launch:
    """Where this process sits in its launch, from torchrun's environment; one process
    (all defaults) outside torchrun.

    :param world_size: processes of the launch, all nodes (``WORLD_SIZE``).
    :param rank: this process's global rank (``RANK``).
    :param local_rank: its rank on its node (``LOCAL_RANK``).
    :param local_world_size: processes per node (``LOCAL_WORLD_SIZE``).
    :param node_rank: its node's rank (``GROUP_RANK``).
    :param nodes: nodes of the launch (``GROUP_WORLD_SIZE``, else world / local size).
    """

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    nodes: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Launch:
        env = os.environ if env is None else env
        world = max(1, _int(env, "WORLD_SIZE", 1))
        local = max(1, min(_int(env, "LOCAL_WORLD_SIZE", world), world))
        return cls(
            world_size=world,
            rank=_int(env, "RANK", 0),
            local_rank=_int(env, "LOCAL_RANK", 0),
            local_world_size=local,
            node_rank=_int(env, "GROUP_RANK", 0),
            nodes=max(1, _int(env, "GROUP_WORLD_SIZE", world // local)),
        )

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Global rank 0: the one process that writes (as in train)."""
        return self.rank == 0

    @property
    def is_node_main(self) -> bool:
        """Local rank 0: the process that starts a subprocess trial on its node."""
        return self.local_rank == 0

    def trial_command(
        self, python: str, module: str, args: list[str], *, master: tuple[str, int] | None = None
    ) -> list[str]:
        """``python -m module args`` under this launch's shape, as the runners launch
        training (:meth:`embedfresh.operators.job_spec.JobSpec.argv`, the AWS Batch
        multi-node command): one process plainly; one node through
        :mod:`embedfresh.jobs.launch` with ``--standalone`` and this node's process count;
        several nodes with ``--nnodes``, this node's ``--node-rank`` and ``master`` (an
        address and a port every node reaches) as the rendezvous.

        :raises ValueError: several nodes and no ``master``.
        """
        if not self.distributed:
            return [python, "-m", module, *args]
        launcher = [python, "-m", "embedfresh.jobs.launch"]
        if self.nodes == 1:
            launcher.append("--standalone")
        else:
            if master is None:
                raise ValueError("a multi-node trial launch needs a master address and port")
            launcher += ["--nnodes", str(self.nodes), "--node-rank", str(self.node_rank)]
            launcher += ["--master-addr", master[0], "--master-port", str(master[1])]
        launcher += ["--nproc-per-node", str(self.local_world_size)]
        return [*launcher, "-m", module, *args]


def launch_world_size(env: Mapping[str, str] | None = None) -> int:
    """The world size of this process's launch (1 outside torchrun): what the compile
    job and the train job both feed the compile-cache key."""
    return Launch.from_env(env).world_size


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without torchrun's worker variables, for a launch started from a worker."""
    return {
        k: v
        for k, v in env.items()
        if k not in TORCHRUN_ENV and not k.startswith(TORCHRUN_ENV_PREFIX)
    }


def free_port() -> int:
    """A TCP port free on this host now (the rendezvous of a multi-node trial launch)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class Ranks:
    """The ranks of a compile job agreeing: rank 0 decides, the others follow it and wait
    for its writes. On one process every call is immediate.

    :param launch: this process's launch.
    :param gather: every rank's object in rank order (a collective); None on one process.
    """

    def __init__(self, launch: Launch, gather: Callable[[Any], list[Any]] | None = None) -> None:
        self.launch = launch
        self._gather = gather

    def agree(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank (every rank must call it)."""
        return value if self._gather is None else self._gather(value)[0]

    def wait_for_main(self) -> None:
        """Return when every rank got here: rank 0 after its writes, the others after it
        (a barrier)."""
        if self._gather is not None:
            self._gather(None)


@contextlib.contextmanager
def join(launch: Launch, backend: str | None, timeout_s: float) -> Iterator[Ranks]:
    """The launch's ranks in one process group while inside (left on the way out).

    :param backend: a backend to build, whose process group the trial's training then
        shares (``torch.compile``: gloo on cpu, nccl on cuda, as train joins it); None: a
        gloo group only, for a job that never touches the device itself (eager, or a
        subprocess trial).
    :param timeout_s: longest wait of one collective in the gloo group (the other ranks
        wait for rank 0's whole subprocess trial).
    """
    if not launch.distributed:
        yield Ranks(launch)
        return
    import torch.distributed as dist  # noqa: PLC0415 - only under torchrun

    if backend is not None:
        from embedfresh.ml.backends import get_backend  # noqa: PLC0415 - imports torch

        device = get_backend(backend)  # joins torchrun's group as train does
        try:
            yield Ranks(launch, device.gather)
        finally:
            device.stop_distributed()
        return

    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=timeout_s))

    def gather(obj: Any) -> list[Any]:
        out: list[Any] = [None] * launch.world_size
        dist.all_gather_object(out, obj)
        return out

    try:
        yield Ranks(launch, gather)
    finally:
        dist.destroy_process_group()
