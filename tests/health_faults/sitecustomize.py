"""Test-only fault injection, loaded by Python at start-up when this directory is on
PYTHONPATH. Nothing in the product knows about it: the health job must find the
fault by itself.

``HEALTH_FAULT``:
- ``all_reduce_rank1``: on torchrun rank 1, ``torch.distributed.all_reduce`` adds 1
  to the rank's contribution before reducing (a corrupting link or NIC).
- ``matmul``: ``torch.matmul`` returns a result off by 1e-3 of its largest value
  (a faulty matrix unit).
- ``no_reduce_scatter``: ``torch.distributed.reduce_scatter_tensor`` raises like a
  gloo build without reduce-scatter.
"""

import os

FAULT = os.environ.get("HEALTH_FAULT", "")

if FAULT == "all_reduce_rank1" and os.environ.get("RANK") == "1":
    import torch.distributed as dist

    _all_reduce = dist.all_reduce

    def _corrupt_all_reduce(tensor, *args, **kwargs):
        tensor.add_(1)
        return _all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = _corrupt_all_reduce

elif FAULT == "matmul":
    import torch

    _matmul = torch.matmul

    def _corrupt_matmul(a, b, *args, **kwargs):
        out = _matmul(a, b, *args, **kwargs)
        return out + 1e-3 * out.abs().max()

    torch.matmul = _corrupt_matmul

elif FAULT == "no_reduce_scatter":
    import torch.distributed as dist

    def _unsupported(*args, **kwargs):
        raise RuntimeError("ProcessGroupGloo does not support reduce_scatter")

    dist.reduce_scatter_tensor = _unsupported
