"""The Parquet schemas of the relevance data set and the corpus, in one place.

Train partitions and the eval split share :data:`EXAMPLE_SCHEMA`: one row per
(query, product) pair with dense product features and a binary relevance label.
Corpora use :data:`CORPUS_SCHEMA` (id, text). The model sees a product as
:func:`product_text` and its dense features through :data:`FEATURES` transforms.
"""

from __future__ import annotations

import pyarrow as pa

# Dense features: (column, transform). The transform maps the raw column to a scale a
# network trains on; it is part of the schema so training, evaluation and serving agree.
FEATURES: tuple[tuple[str, str], ...] = (
    ("price", "log1p"),
    ("rating", "div5"),
    ("review_count", "log1p"),
    ("discount", "identity"),
    ("in_stock", "identity"),
    ("days_since_listed", "log1p"),
)
FEATURE_NAMES: tuple[str, ...] = tuple(name for name, _ in FEATURES)

EXAMPLE_SCHEMA = pa.schema(
    [
        pa.field("query_id", pa.int64(), nullable=False),
        pa.field("query", pa.string(), nullable=False),
        pa.field("product_id", pa.int64(), nullable=False),
        pa.field("product_title", pa.string(), nullable=False),
        pa.field("product_description", pa.string(), nullable=False),
        *[pa.field(name, pa.float32(), nullable=False) for name in FEATURE_NAMES],
        pa.field("label", pa.int8(), nullable=False),
    ]
)

JUDGMENTS_SCHEMA = pa.schema(
    [
        pa.field("query_id", pa.int64(), nullable=False),
        pa.field("query", pa.string(), nullable=False),
        pa.field("doc_id", pa.int64(), nullable=False),
        pa.field("grade", pa.int8(), nullable=False),
    ]
)
"""Graded judgments of an eval split (docs/DATA.md), as the generator writes them:
``doc_id`` is the corpus's own id (int64 here; a team's may be strings), ``grade`` 0-3."""

CORPUS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
    ]
)


def product_text(title: str, description: str) -> str:
    """The text the encoder sees for a product (also the corpus ``text``)."""
    return f"{title}. {description}" if description else title
