"""Health checks run before anything expensive: devices, tensor arithmetic against a
float64 reference, collectives across ranks with bus bandwidth, and on Neuron hosts
``neuron-ls``/``nccom-test``. Entry point: ``python -m jobs.health``
(:mod:`jobs.health.job`); the report format is in :mod:`jobs.health.report`.
"""

from jobs.health.config import HealthConfig

__all__ = ["HealthConfig"]
