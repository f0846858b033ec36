"""The ML library the jobs are built from: model, tokenizer, data, checkpoint manager,
backends, training and evaluation steps, embedding kernels, gate statistics, health
checks and compile caches. Imports :mod:`embedfresh.core`, never a job or Airflow."""
