"""``python -m jobs.embed``: see :mod:`jobs.embedding.job`."""

from jobs.cli import main_for
from jobs.embedding.config import EmbedConfig
from jobs.embedding.job import embed

if __name__ == "__main__":
    main_for("embed", EmbedConfig, embed)
