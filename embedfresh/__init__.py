"""embedfresh: keeps a production embedding model fresh on any accelerator, with Airflow 3.

Rooms, each importing only the ones below it (import-linter holds the doors, see
docs/ARCHITECTURE.md):

- :mod:`embedfresh.operators`, :mod:`embedfresh.plugins`: the control plane (Airflow);
  imports :mod:`embedfresh.core` only.
- :mod:`embedfresh.jobs`: one program per job (``python -m embedfresh.jobs.<name>``).
- :mod:`embedfresh.ml`: model, data, checkpoints, backends, embedding kernels, statistics.
- :mod:`embedfresh.core`: the torch-free contract: exit codes, configs and CLI, storage,
  layout, markers, registry, result records, shared names.
"""

__version__ = "0.1.0"
