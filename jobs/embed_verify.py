"""``python -m jobs.embed_verify``: see :mod:`jobs.embedding.verify`."""

from jobs.cli import main_for
from jobs.embedding.config import EmbedConfig
from jobs.embedding.verify import verify

if __name__ == "__main__":
    main_for("embed_verify", EmbedConfig, verify)
