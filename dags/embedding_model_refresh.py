"""Daily refresh of the production embedding model, released with its corpus embeddings.

wait_for_partition -> health -> compile -> train -> evaluate -> gate -> gate_passed ->
corpora -> list_shards -> embed (mapped, the candidate) -> verify -> load_index ->
search_check -> [approve ->] release -> freshness (verify, load_index and search_check
mapped once per corpus).

``wait_for_partition`` waits for a scheduled run's training partition to land (a
deferrable sensor; ``EMBEDFRESH_PARTITION_WAIT_SECONDS``, by default the deadline less
2 hours), logging what it waits for and what the store holds; past its timeout it fails
naming both. The accelerator steps (health, compile, train) take a slot of the
accelerator pool, and every job step has a time limit (``operators/resources.py``).
People are told (``operators/notify.py``, when the deployment configures e-mail or a
webhook) of a gate decision other than PASS, a failed run and a missed deadline.

``health`` checks the run's inputs in the store (the model, the corpora: a missing one
fails the run naming what is there) and the devices and links the run will use (a
faulty one fails the run before anything expensive starts, no retry); ``compile`` traces
the training graphs into the shared compile cache (a hit takes seconds); ``train`` trains
the production model incrementally on the data interval's partition (resuming from its
last checkpoint on a retry, with exponential backoff; the ``parallelism`` Param shards a
model too large for one device over the ranks, ``nproc`` per node); ``evaluate`` scores it on the
fixed held-out set (search on the judged queries over the corpus, docs/GATE.md);
``gate`` decides whether it may go live (the 0.1% SLA on nDCG@10, growing its
evaluation while undecided). A gate that does not PASS (FAIL, INCONCLUSIVE) is a
decision, not an error: the gate task succeeds with the decision as its XCom (each
metric's d and interval), ``gate_passed`` skips everything after it, and the run ends
green with production and the live release untouched; the decision is on the Model
quality page.

When nothing decides, a person does: with ``EMBEDFRESH_APPROVAL_TIMEOUT_MINUTES`` set
(off by default, so scheduled runs stay unattended), an INCONCLUSIVE gate goes on to
embed, load and check the candidate, an INCONCLUSIVE search check ends with its
figures, and ``approve`` (Airflow's human-in-the-loop ``ApprovalOperator``) parks the
run until a person approves (the release is recorded with who and why) or rejects;
no answer before the timeout is a Reject. A FAIL is never asked about.
``freshness`` runs last whatever happened: production's age in days of data, and an
e-mail or webhook (``EMBEDFRESH_STALE_AFTER_DAYS``, default 3) naming the decisions that
held it when it is stale.

Then the candidate, not yet live, is made ready to serve, for every corpus of the
``corpora`` Param (default ``products``): ``embed`` (one mapped task per shard; with
``EMBEDFRESH_EMBED_FAN_OUT=array``, one AWS Batch array job per corpus, as
``corpus_embeddings``) and
``verify`` write its verified embedding set, ``load_index`` loads it into the release's
own table of the vector index (pgvector; the embedded server by default), and
``search_check`` proves search on that table (faithful to the exact search, and no worse
than the live release's). Only then does ``release`` make the model and its document
vectors live together, by compare-and-swap (a corpus of the live release left out of
``corpora`` must be named in the ``drop_corpora`` Param, whose live views it drops, or
the release is refused), and announce the Assets
``embedfresh://models/<model>`` and ``embedfresh://embeddings/<model>/<corpus>``. Until
that moment a search service reading the live release gets the previous one, whole; a
failed embed, verify, load or check leaves it untouched and says why in its task.

A Deadline Alert watches the whole run: if it is not done within
``EMBEDFRESH_REFRESH_DEADLINE_SECONDS`` (default 6 hours) of being queued, the breach is
logged and written to ``runs/<model>/<run_id>/reports/deadline.json`` (see
``operators/deadline.py``), and Airflow marks the run's deadline missed.

The Params' defaults run the embedded demo on CPU: generate data into the artifact root
first (``python -m embedfresh.jobs.generate_data --root <artifact_root>``), then trigger.

The schedule is an explicit ``CronDataIntervalTimetable``: with a bare ``"@daily"``
Airflow 3 uses ``CronTriggerTimetable``, whose runs have an empty data interval
(start == end), which would leave the training job no partition to read. A scheduled
run's data interval is the day before its run time: the run of 2026-01-02 00:00 trains
on partition ``dt=2026-01-01``; so does a backfill run of that date.

A manual run (the Trigger form, a REST trigger, ``dag.test()``) never trains on its
data interval, whatever its logical date (the form sends *now*, whose interval ends at
a day the store does not hold yet): the Param ``day`` (``YYYY-MM-DD``) names its
partition, and left empty (the Trigger form's default, a REST trigger without conf)
the run trains on the newest ``dt=`` partition in the store, looked up by ``compile``
and ``train`` when they start. A day the store does not hold fails at once, naming the
days it holds. A scheduled run given ``day`` trains on that day instead of its
interval.
"""

from __future__ import annotations

import datetime as dt

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import DAG, CronDataIntervalTimetable, Param

from embedfresh.operators import (
    AcceleratorHealthOperator,
    AheadOfTimeCompileOperator,
    BatchArrayEmbeddingOperator,
    CorporaOperator,
    CorpusShardsOperator,
    EmbeddingVerifyOperator,
    EvaluationOperator,
    IncrementalTrainingOperator,
    IndexLoadOperator,
    QualityGateOperator,
    ReleaseOperator,
    SearchCheckOperator,
    ShardEmbeddingOperator,
)
from embedfresh.operators.approval import ReleaseApprovalOperator, approval_timeout
from embedfresh.operators.deadline import refresh_deadline_alert
from embedfresh.operators.freshness import FreshnessOperator
from embedfresh.operators.gate import decision_passed
from embedfresh.operators.notify import notifiers
from embedfresh.operators.params import (
    COMMON_JOB_ARGS,
    DAY_ARG,
    INDEX_ARGS,
    common_params,
    corpora_param,
    dataset_param,
    day_param,
    drop_corpora_param,
    gate_metrics_param,
)
from embedfresh.operators.partition import TrainingPartitionSensor
from embedfresh.operators.resources import embed_fan_out, embed_max_children, task_resources

CORPORA = "{{ params.corpora | tojson }}"
#: The judged queries' cap, rendered empty when the Param is (the whole pool).
CAP = "{{ params.judged_queries or '' }}"
#: How long a person has to approve an undecided release; None: nobody is asked.
APPROVAL = approval_timeout()
# The candidate: the version the run's train job published (named after the run).
CANDIDATE = "{{ run_id }}"
# The data set the jobs train on and are judged by.
DATASET = "{{ params.dataset }}"
JUDGED_ON = {"job_settings": {"dataset": DATASET}}
# What the compile trial and the training share, so the trial traces the same graphs.
TRAINING = {
    **COMMON_JOB_ARGS,
    **DAY_ARG,
    "epochs": "{{ params.epochs }}",
    "nproc_per_node": "{{ params.nproc }}",
    "job_settings": {"parallelism": "{{ params.parallelism }}", "dataset": DATASET},
}

with DAG(
    "embedding_model_refresh",
    description="Incremental refresh of the production embedding model, released with its "
    "corpus embeddings behind a quality gate and a search check",
    doc_md=__doc__,
    schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": dt.timedelta(seconds=30)},
    deadline=refresh_deadline_alert(),
    params={
        **common_params(),
        "epochs": Param(3, type="integer", minimum=1, description="Training epochs"),
        "nproc": Param(
            1,
            type="integer",
            minimum=1,
            description="Processes per node for health, compile and train (torchrun)",
        ),
        "parallelism": Param(
            "ddp",
            enum=["ddp", "fsdp", "hsdp"],
            description="How training's ranks hold the model: ddp (a whole replica each), "
            "fsdp (sharded over every rank; needs nproc >= 2 or several nodes), hsdp "
            "(sharded within a node, replicated across nodes)",
        ),
        "dataset": dataset_param(),
        "gate_metrics": gate_metrics_param(),
        "judged_queries": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            description="The most judged queries the evaluation, the gate and the search "
            "check use (empty: the whole pool; they grow into it only while undecided)",
        ),
        "corpora": corpora_param(),
        "drop_corpora": drop_corpora_param(),
        "day": day_param(),
    },
    tags=["embedfresh"],
    on_failure_callback=notifiers("run_failed"),
) as dag:
    # A scheduled run waits for its day's data (a manual run does not: it fails at once
    # naming the days the store holds).
    wait_for_partition = TrainingPartitionSensor(
        task_id="wait_for_partition",
        artifact_root="{{ params.artifact_root }}",
        model="{{ params.model }}",
        dataset=DATASET,
        **DAY_ARG,
    )
    # The first job also checks the run's inputs: a model nobody published, or a corpus
    # that is not there, fails here rather than after training.
    health = AcceleratorHealthOperator(
        task_id="health",
        **COMMON_JOB_ARGS,
        **task_resources("health"),
        nproc_per_node="{{ params.nproc }}",
        check_inputs={"corpus": "{{ params.corpora | join(',') }}"},
        retries=0,
    )
    compile_graphs = AheadOfTimeCompileOperator(
        task_id="compile", **TRAINING, **task_resources("compile")
    )
    train = IncrementalTrainingOperator(
        task_id="train",
        **TRAINING,
        **task_resources("train"),
        retries=2,
        retry_delay=dt.timedelta(seconds=10),
        retry_exponential_backoff=2.0,
    )
    evaluate = EvaluationOperator(
        task_id="evaluate",
        **COMMON_JOB_ARGS,
        **JUDGED_ON,
        **task_resources("evaluate"),
        max_queries=CAP,
    )
    gate = QualityGateOperator(
        task_id="gate",
        **COMMON_JOB_ARGS,
        **JUDGED_ON,
        **task_resources("gate"),
        metrics="{{ params.gate_metrics | tojson }}",
        max_queries=CAP,
        retries=0,
        on_success_callback=notifiers("gate"),  # tells people of a decision other than PASS
    )
    # A gate that does not PASS is a decision: the run ends green, nothing below runs
    # (but for an INCONCLUSIVE one when the deployment lets a person decide).
    gate_passed = ShortCircuitOperator(
        task_id="gate_passed",
        python_callable=decision_passed,
        op_args=[gate.output],
        op_kwargs={"ask": APPROVAL is not None},
    )

    corpora = CorporaOperator(
        task_id="corpora", artifact_root="{{ params.artifact_root }}", corpora=CORPORA
    )
    if embed_fan_out() == "mapped":  # one task per shard group (any runner)
        list_shards = CorpusShardsOperator(
            task_id="list_shards",
            artifact_root="{{ params.artifact_root }}",
            corpora=corpora.output,
        )
        embed = ShardEmbeddingOperator.partial(
            task_id="embed",
            **COMMON_JOB_ARGS,
            **JUDGED_ON,
            **task_resources("embed"),
            version=CANDIDATE,
        ).expand_kwargs(list_shards.output)
        corpora >> list_shards >> embed
    else:  # one AWS Batch array job per corpus
        embed = BatchArrayEmbeddingOperator.partial(
            task_id="embed",
            **COMMON_JOB_ARGS,
            **JUDGED_ON,
            **task_resources("embed", "aws_batch"),
            version=CANDIDATE,
            max_children=embed_max_children(),
        ).expand(corpus=corpora.output)
        corpora >> embed
    verify = EmbeddingVerifyOperator.partial(
        task_id="verify", **COMMON_JOB_ARGS, **task_resources("verify"), version=CANDIDATE
    ).expand(corpus=corpora.output)
    load_index = IndexLoadOperator.partial(
        task_id="load_index", **COMMON_JOB_ARGS, **INDEX_ARGS, **task_resources("load_index")
    ).expand(corpus=corpora.output)
    search_check = SearchCheckOperator.partial(
        task_id="search_check",
        **COMMON_JOB_ARGS,
        **JUDGED_ON,
        **INDEX_ARGS,
        **task_resources("search_check"),
        gate="gate",
        ask=APPROVAL is not None,
        max_queries=CAP,
        retries=0,
    ).expand(corpus=corpora.output)
    release = ReleaseOperator(
        task_id="release",
        **COMMON_JOB_ARGS,
        **INDEX_ARGS,
        **task_resources("release"),
        corpora=CORPORA,
        drop_corpora="{{ params.drop_corpora | tojson }}",
        gate="gate",
        approval="approve" if APPROVAL is not None else None,
        # After an approval that skipped itself (nothing to ask), the release still runs.
        trigger_rule="none_failed" if APPROVAL is not None else "all_success",
    )

    (
        wait_for_partition
        >> health
        >> compile_graphs
        >> train
        >> evaluate
        >> gate
        >> gate_passed
        >> corpora
    )
    embed >> verify >> load_index >> search_check
    if APPROVAL is None:
        search_check >> release
    else:  # when nothing decides, a person does (operators/approval.py)
        approve = ReleaseApprovalOperator(
            task_id="approve",
            gate="gate",
            search_check="search_check",
            model="{{ params.model }}",
            response_timeout=APPROVAL,
        )
        search_check >> approve >> release
    # Last, whatever happened (a teardown: never skipped, and never the run's own state):
    # how old production is, and people told when it is stale.
    freshness = FreshnessOperator(
        task_id="freshness",
        artifact_root="{{ params.artifact_root }}",
        model="{{ params.model }}",
        on_success_callback=notifiers("stale"),
    ).as_teardown()
    [gate_passed, release] >> freshness
