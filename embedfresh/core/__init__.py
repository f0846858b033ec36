"""The torch-free contract shared by the data plane and the control plane.

Exit codes, configs and the job CLI, the artifact store and its layout, commit markers,
the model registry, corpus shards, result records and the names both planes agree on
(:mod:`~embedfresh.core.settings`). Nothing here imports torch, transformers, boto3 or
Airflow; ``dags/``, ``operators/`` and ``plugins/`` import nothing else of the package.
"""
