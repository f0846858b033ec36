"""``python -m jobs.export_st``: see :mod:`jobs.embedding.export`."""

from jobs.cli import main_for
from jobs.embedding.config import ExportConfig
from jobs.embedding.export import export

if __name__ == "__main__":
    main_for("export_st", ExportConfig, export)
