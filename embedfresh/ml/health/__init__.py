"""Health checks run before anything expensive: devices, tensor arithmetic against a
float64 reference, collectives across ranks with bus bandwidth, and on Neuron hosts
``neuron-ls``/``nccom-test``. Entry point: ``python -m embedfresh.jobs.health``
(:mod:`embedfresh.jobs.health`); the report format is in :mod:`embedfresh.ml.health.report`.
"""

from embedfresh.core.config import HealthConfig

__all__ = ["HealthConfig"]
