"""``python -m jobs.gate``: see :mod:`jobs.gate.job`."""

from jobs.cli import main_for
from jobs.config import GateConfig
from jobs.gate.job import run_gate

if __name__ == "__main__":
    main_for("gate", GateConfig, run_gate)
