"""Training over several ranks beyond data parallel: how a model is sharded
(:mod:`~embedfresh.ml.parallel.sharding`: ``parallelism`` fsdp and hsdp, FSDP2 on a
device mesh, activation checkpointing) and how its shards are checkpointed through
``torch.distributed.checkpoint`` into the artifact store
(:mod:`~embedfresh.ml.parallel.store_dcp`)."""
