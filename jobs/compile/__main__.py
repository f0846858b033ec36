"""``python -m jobs.compile --config compile.yaml [--set key=value ...]``."""

from jobs.cli import main_for
from jobs.compile.job import compile_job
from jobs.config import CompileConfig

if __name__ == "__main__":
    main_for("compile", CompileConfig, compile_job)
