"""Reading one Parquet object of the artifact store safely, and Arrow's allocator for
jobs that stream many of them (torch-free)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore


def read_parquet(
    store: ArtifactStore, rel: str, read_dictionary: list[str] | None = None
) -> pa.Table:
    """Read one Parquet object whole into Arrow-owned memory, then parse it.

    Not ``pq.read_table(python_file_or_bytes)``: its scanner threads may drop the last
    reference to the Python-backed source after the call returns, and doing so needs
    the GIL; at interpreter exit that thread is killed inside a C++ destructor and the
    job dies with SIGABRT ("terminate called without an active exception") instead of
    its exit code (apache/arrow#34314; seen here in about half the runs once torch is
    imported). Memory owned by Arrow needs no GIL to free.

    ``read_dictionary``: columns read dictionary-encoded (a column of few distinct,
    often repeated strings stays small in memory).

    :raises BadInputError: the object is not a readable Parquet file.
    """
    return read_parquet_bytes(store.read_bytes(rel), store.url(rel), read_dictionary)


def read_parquet_bytes(data: bytes, url: str, read_dictionary: list[str] | None = None) -> pa.Table:
    """:func:`read_parquet` of bytes already read (``url`` names them in errors)."""
    out = pa.BufferOutputStream()
    out.write(data)
    del data
    try:
        return pq.read_table(pa.BufferReader(out.getvalue()), read_dictionary=read_dictionary)
    except (pa.ArrowInvalid, OSError) as e:
        raise BadInputError(f"{url} is not a readable Parquet file: {e}") from e


def large_blocks_back_to_the_os(threshold: int = 1 << 20) -> bool:
    """Keep every allocation of ``threshold`` bytes or more mmapped, so it goes back to
    the OS when freed; True when glibc took the setting (no-op elsewhere).

    glibc's malloc raises its mmap threshold each time an mmapped block is freed (up to
    32 MiB): after the first part of an embedding set is freed, blocks of that size come
    from the heap and fragment it, and a job that reads part after part holds a
    high-water mark that creeps with their number (the index load: 481 -> 566 MiB over
    ten parts of 50,000 rows; 474 -> 478 with the threshold fixed, docs/BENCHMARKS.md).
    ``mallopt(M_MMAP_THRESHOLD)`` fixes it, and turns the adjustment off."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_mmap_threshold = -3  # <malloc.h>
    return bool(mallopt(ctypes.c_int(m_mmap_threshold), ctypes.c_int(threshold)))


@contextlib.contextmanager
def system_memory_pool() -> Iterator[None]:
    """Arrow allocates from the C allocator while inside (every thread: the pool is
    process-wide), then the previous pool again.

    Arrow's default pool (mimalloc in the pyarrow wheels) keeps pages of every size class
    it has used, so a job that reads shard after shard of varying sizes holds a high-water
    mark that creeps with their number: the embed job's peak RSS grew 2.9% from 100,000 to
    1,000,000 rows on it, 0.6% inside this (the C allocator hands large blocks back at
    once; docs/BENCHMARKS.md, 2026-11-27). The pool is process-wide: two jobs running in
    threads of one process would restore it in the wrong order (each job is its own
    process here)."""
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


def job_memory_pool() -> contextlib.AbstractContextManager[None]:
    """A job's Arrow pool: the C allocator (:func:`system_memory_pool`), unless the
    operator chose one with ``ARROW_DEFAULT_MEMORY_POOL``."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return contextlib.nullcontext()
    return system_memory_pool()
