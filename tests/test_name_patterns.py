"""Names read from a store are matched whole: a trailing newline (which ``$`` accepts in
Python's ``re``) never makes an object a shard, a partition or a checkpoint step."""

from __future__ import annotations

import pytest

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.partitions import partition_day
from embedfresh.core.shards import list_parts
from embedfresh.core.storage import ArtifactStore


def test_shards_are_listed_only_for_whole_names(tmp_path):
    store = ArtifactStore(f"file://{tmp_path}")
    for name in ("part-00000.parquet", "part-00001.parquet\n", "part-00002.parquet.tmp"):
        store.write_bytes(f"corpora/c/{name}", b"x")
    assert list_parts(store, "corpora/c") == {0: "part-00000.parquet"}


@pytest.mark.parametrize("name", ["dt=2026-01-01\n", "dt=2026-01-01 ", "xdt=2026-01-01"])
def test_partition_names_are_matched_whole(name):
    assert partition_day("dt=2026-01-01") is not None
    assert partition_day(name) is None


@pytest.mark.parametrize("value", ["tiny\n", "tiny\r\n", "\ntiny"])
def test_ids_with_a_newline_are_refused(value):
    with pytest.raises(BadInputError, match="invalid model"):
        layout.safe_id(value, "model")
