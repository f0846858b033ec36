"""The Parquet schemas of the relevance data set and the corpus, in one place.

**Pairs** (the train partitions and the eval split, docs/DATA.md "Training data"): one
row per (query, document) pair, the contract a team's data follows:

- ``query_id`` (integer or string) and ``query`` (its text, not empty);
- ``doc_id``: the document's id in the data set's corpus (integer or string, as the
  corpus has it); its text comes from the corpus unless the row carries ``doc_text``;
- the label, which says what the data is (:data:`LABEL_KINDS`): ``label`` 0/1
  (binary), ``grade`` 0-3 (graded, as judgments are), or neither (positive pairs only:
  clicks or purchases, every row a match);
- zero or more numeric feature columns, exactly those declared (:data:`TRANSFORMS`):
  text-only is the default. The demo declares :data:`DEMO_FEATURES`.

Corpora use :data:`CORPUS_SCHEMA` (id, text); eval judgments :data:`JUDGMENTS_SCHEMA`.
"""

from __future__ import annotations

import pyarrow as pa

#: How a declared feature's raw column is mapped to a scale a network trains on; part of
#: the model's spec, so training, evaluation and serving agree.
TRANSFORMS = ("identity", "log1p", "div5")

Features = tuple[tuple[str, str], ...]
"""Declared features: ``(column, transform)`` pairs in the order the head takes them (a
list, never a mapping, wherever it is stored: JSON objects do not keep an order)."""

#: The demo generator's dense product features and their transforms: its data set's
#: declaration (``datasets/{dataset}/dataset.json``).
DEMO_FEATURES: Features = (
    ("price", "log1p"),
    ("rating", "div5"),
    ("review_count", "log1p"),
    ("discount", "identity"),
    ("in_stock", "identity"),
    ("days_since_listed", "log1p"),
)

#: Every pair row has these (``doc_text`` is optional, the label column by kind).
PAIR_COLUMNS = ("query_id", "query", "doc_id")
DOC_TEXT = "doc_text"
#: The label column of each kind of data; positive-only data has none.
LABEL_KINDS = {"binary": "label", "graded": "grade", "positive": None}
MAX_GRADE = 3

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


def demo_pair_schema() -> pa.Schema:
    """The demo generator's pairs: integer ids, inline text, its six features, binary
    labels."""
    return pa.schema(
        [
            pa.field("query_id", pa.int64(), nullable=False),
            pa.field("query", pa.string(), nullable=False),
            pa.field("doc_id", pa.int64(), nullable=False),
            pa.field(DOC_TEXT, pa.string(), nullable=False),
            *[pa.field(name, pa.float32(), nullable=False) for name, _ in DEMO_FEATURES],
            pa.field("label", pa.int8(), nullable=False),
        ]
    )
