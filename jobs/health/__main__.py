"""``python -m jobs.health``: see :mod:`jobs.health.job`."""

from jobs.cli import main_for
from jobs.health.config import HealthConfig
from jobs.health.job import health

if __name__ == "__main__":
    main_for("health", HealthConfig, health)
