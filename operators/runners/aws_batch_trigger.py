"""The trigger a deferred AWS Batch task waits in: the provider's, plus cancel.

A separate module because it subclasses the provider's ``BatchJobTrigger`` at import
time (boto3 and the provider): only the triggerer and a deferring task import it, never
a DAG file.
"""

from __future__ import annotations

import asyncio

from airflow.providers.amazon.aws.triggers.batch import BatchJobTrigger


class BatchJobKillingTrigger(BatchJobTrigger):
    """``BatchJobTrigger`` that terminates its job when a person acts on the task.

    The provider's trigger has no ``on_kill``: marking a deferred task failed (or
    clearing it) in the UI stopped the wait but left the Batch job running and billing.
    The triggerer calls :meth:`on_kill` on such a user action only, never on its own
    shutdown or a timeout, so a triggerer restart leaves the job running for the next
    triggerer to wait on.
    """

    async def on_kill(self) -> None:
        job_id = self.serialized_fields["job_id"]
        self.log.info("Terminating AWS Batch job %s: its task was stopped by a user", job_id)
        hook = self.hook()
        await asyncio.to_thread(
            hook.conn.terminate_job,
            jobId=job_id,
            reason="Airflow task stopped by a user while deferred (trigger on_kill)",
        )
