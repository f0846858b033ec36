"""Batch embeddings of a corpus with a model version (DESIGN "Batch embeddings").

``python -m embedfresh.jobs.embed`` embeds corpus shards (:mod:`embedfresh.jobs.embed`);
``python -m embedfresh.jobs.embed_verify`` checks the result and writes the manifest
(:mod:`embedfresh.jobs.embed_verify`). Kept import-light: torch is imported by the job only.
"""
