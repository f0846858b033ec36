"""Multi-node training across two real network hosts (network namespaces and a veth).

Each host runs the exact command the AWS Batch runner builds for a multi-node parallel
job (``AwsBatchRunner.command``: a ``sh -c`` script starting :mod:`embedfresh.jobs.launch`)
with the container environment the runner sends and the variables Batch gives each node:
``AWS_BATCH_JOB_NODE_INDEX``, ``AWS_BATCH_JOB_NUM_NODES``, ``AWS_BATCH_JOB_MAIN_NODE_INDEX``,
and on the child node only ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS`` (Batch does not
set it on the main node, which falls back to ``hostname -i``). Gloo goes over the veth
(``GLOO_SOCKET_IFNAME``, as a user names the ENI/EFA interface). Both hosts see one
``file://`` store, as Batch nodes see one S3 bucket.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from embedfresh.operators.job_spec import JobSpec, encode_setting
from embedfresh.operators.runners.aws_batch import AwsBatchRunner, BatchSettings
from tests import netns
from tests.conftest import ROOT, job_env, run_job
from tests.sharded import DDP_REFERENCE, Run, as_settings
from tests.test_train_ddp import free_port, weights

BASE = {"data_interval_start": "2026-01-01", "init": "base", "log_every": 1}
BASE_SETS = [f"{k}={v}" for k, v in BASE.items()]
# No dropout and no in-batch contrastive term: the mean of the ranks' gradients is then
# the same sum whichever host a rank runs on (see tests/test_train_ddp.py).
SAME_MATH = {"contrastive_weight": 0, "dropout": 0, "batch_size": 16}
NODE_TIMEOUT_S = 300
# What the main node's launcher exits with when the other node is lost mid-run: 75,
# transient (embedfresh.core.cli.lost_peer), so Batch's evaluateOnExit retries it.
LOST_PEER_EXIT = 75


@pytest.fixture
def hosts() -> Iterator[tuple[netns.Host, netns.Host]]:
    reason = netns.unavailable()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and two network hosts cannot be made: {reason}")
        pytest.skip(f"two network hosts cannot be made: {reason}")
    with netns.two_hosts() as pair:
        yield pair


@dataclass
class Node:
    host: netns.Host
    proc: subprocess.Popen
    log: Path

    def wait(self, timeout: float = NODE_TIMEOUT_S) -> int:
        return self.proc.wait(timeout=timeout)

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def batch_command(job: str, settings: dict, nproc_per_node: int = 1) -> tuple[list[str], dict]:
    """The runner's command and container environment for a two-node job."""
    runner = AwsBatchRunner(
        BatchSettings(job_definition="mnp", job_queue="q", num_nodes=2, python=sys.executable)
    )
    spec = JobSpec(job, settings, nproc_per_node=nproc_per_node)
    env = {e["name"]: e["value"] for e in runner.environment(spec)}
    return runner.command(spec), env


def start_node(
    host: netns.Host, index: int, main: netns.Host, command: list[str], container: dict, log: Path
) -> Node:
    env = {k: v for k, v in job_env(container).items() if not k.startswith("AWS_BATCH_")}
    env.update(
        AWS_BATCH_JOB_NODE_INDEX=str(index),
        AWS_BATCH_JOB_NUM_NODES="2",
        AWS_BATCH_JOB_MAIN_NODE_INDEX="0",
        GLOO_SOCKET_IFNAME=host.ifname,
    )
    if index != 0:  # Batch gives the main node's address to the child nodes only
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = main.addr
    with log.open("w") as err:
        proc = subprocess.Popen(
            host.argv(command),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    return Node(host, proc, log)


def run_two_nodes(
    hosts: tuple[netns.Host, netns.Host],
    job: str,
    settings: dict,
    logs: Path,
    nproc_per_node: int = 1,
) -> list[Node]:
    command, container = batch_command(job, settings, nproc_per_node)
    main = hosts[0]
    nodes = [
        start_node(h, i, main, command, container, logs / f"{settings['run_id']}-node{i}.log")
        for i, h in enumerate(hosts)
    ]
    for node in nodes:
        node.wait()
    return nodes


def one_host(root: str, job: str, settings: dict, nproc: int = 2) -> subprocess.CompletedProcess:
    """The same job on one host: the launcher with ``nproc`` processes on loopback."""
    cmd = [sys.executable, "-m", "embedfresh.jobs.launch", "--nproc-per-node", str(nproc)]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    cmd += ["-m", f"embedfresh.jobs.{job}"]
    cmd += JobSpec(job, settings).job_args()
    return subprocess.run(
        cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=NODE_TIMEOUT_S
    )


def store_path(root: str, *parts: str) -> Path:
    return Path(root.removeprefix("file://"), *parts)


def weights_sha256(root: str, version: str) -> str:
    path = store_path(root, "models/tiny/versions", version, "model.safetensors")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def train_report(root: str, run_id: str) -> dict:
    return json.loads(store_path(root, "runs/tiny", run_id, "reports/train.json").read_text())


def test_two_hosts_train_bit_exact_against_one_host(
    hosts, root: str, tmp_path: Path, ddp_reference: Run
) -> None:
    # One host: the suite's shared 2-rank run (tests/sharded.py), the same settings.
    settings = {"artifact_root": root, **as_settings(DDP_REFERENCE)}
    started = time.monotonic()
    nodes = run_two_nodes(hosts, "train", {**settings, "run_id": "hosts"}, tmp_path)
    two_host_s = time.monotonic() - started
    for node in nodes:
        assert node.proc.returncode == 0, node.stderr()[-3000:]

    across, one = train_report(root, "hosts"), ddp_reference.report()
    assert across["world_size"] == 2 and (across["nodes"], across["devices_per_node"]) == (2, 1)
    assert (one["nodes"], one["devices_per_node"]) == (1, 2)
    assert across["steps"] == one["steps"] == 6
    reference = hashlib.sha256(ddp_reference.weights_path().read_bytes()).hexdigest()
    assert weights_sha256(root, "hosts") == reference
    print(f"two-host train: {two_host_s:.1f} s")


def test_hsdp_across_two_hosts_of_two_processes_is_single_host_ddp_by_the_parity_gate(
    hosts, root: str, tmp_path: Path
) -> None:
    """parallelism=hsdp over 2 hosts x 2 processes (a 2 x 2 mesh: each host's pair shards
    the model, the hosts replicate it and all-reduce across the veth) against ddp on one
    host, from one start version with the same global batch (32: 4 ranks x 8 there, 2
    ranks x 16 here, for the suite makes one 4-process launch on one host, the 4 -> 2
    reshard's in tests/test_train_fsdp.py): the parity job, config against config, gates
    the two curves at every evaluation point."""
    start = run_job("train", f"artifact_root={root}", "run_id=v0", *BASE_SETS, "max_steps=2")
    assert start.returncode == 0, start.stderr[-3000:]
    settings = {
        "artifact_root": root,
        "run_id": "sharding",
        "init_version": "v0",
        "data_interval_start": "2026-01-01",
        "backend_a": "cpu",
        "backend_b": "cpu",
        "config_a": {"parallelism": "ddp", "batch_size": 16},
        "config_b": {"parallelism": "hsdp"},
        **SAME_MATH,
        "batch_size": 8,
        "max_steps": 6,
        "eval_every": 3,
        "log_every": 1,
    }
    a = one_host(root, "parity", {**settings, "step": "a"}, nproc=2)
    assert a.returncode == 0, a.stderr[-3000:]
    nodes = run_two_nodes(hosts, "parity", {**settings, "step": "b"}, tmp_path, nproc_per_node=2)
    for node in nodes:
        assert node.proc.returncode == 0, node.stderr()[-3000:]
    across = train_report(root, "sharding-cpu-b")
    assert across["parallelism"]["mesh"] == {"replicate": 2, "shard": 2}
    assert (across["world_size"], across["nodes"]) == (4, 2)
    one_host_ddp = train_report(root, "sharding-cpu-a")
    assert one_host_ddp["parallelism"] == {"parallelism": "ddp"}
    assert (one_host_ddp["world_size"], one_host_ddp["nodes"]) == (2, 1)
    assert 2 * one_host_ddp["batch_size"] == across["world_size"] * across["batch_size"] == 32

    compared = run_job(
        "parity", *(f"{k}={encode_setting(v)}" for k, v in settings.items()), "step=compare"
    )
    assert compared.returncode == 0, compared.stderr[-3000:]
    gate = json.loads(store_path(root, "runs/tiny/sharding/reports/gate.json").read_text())
    assert gate["verdict"] == "PASS" and gate["steps"] == [3, 6], gate["reason"]
    assert gate["candidate"]["config"] == {"parallelism": "hsdp"}
    print(f"hsdp across hosts vs ddp on one: max |d| {gate['max_abs_d']:.2e}")
    # The same model, but for the order of the sums.
    ddp, hsdp = weights(root, "sharding-cpu-a"), weights(root, "sharding-cpu-b")
    for k in ddp:
        torch.testing.assert_close(hsdp[k], ddp[k], rtol=1e-4, atol=1e-5, msg=k)


def test_the_main_node_finds_its_own_address_and_not_loopback(hosts) -> None:
    # The runner's fallback on the main node is ``hostname -i``; each host's /etc/hosts
    # maps the hostname to its address, as a container runtime writes it.
    for host in hosts:
        own = subprocess.run(host.argv(["hostname", "-i"]), capture_output=True, text=True)
        assert own.stdout.split() == [host.addr], own.stderr


def test_health_collectives_across_two_hosts_report_bus_bandwidth(
    hosts, root: str, tmp_path: Path
) -> None:
    settings = {
        "artifact_root": root,
        "run_id": "hosts-health",
        "expected_world_size": 2,
        "collectives": True,
    }
    nodes = run_two_nodes(hosts, "health", settings, tmp_path)
    for node in nodes:
        assert node.proc.returncode == 0, node.stderr()[-3000:]
    path = store_path(root, "runs/tiny/hosts-health/reports/health.json")
    health = json.loads(path.read_text())
    assert health["verdict"] == "PASS", health
    coll = health["collectives"]
    assert {c["op"] for c in coll} == {"all_reduce", "all_gather", "reduce_scatter"}
    for c in coll:
        assert c["world_size"] == 2 and not c["trivial"] and c["passed"], c
        assert c["busbw_gbps"] > 0 and c["time_us"] > 0, c
    for c in coll:  # the figures docs/RELIABILITY.md quotes (pytest -s)
        print(f"{c['op']} {c['size_bytes']} B: busbw {c['busbw_gbps']} GB/s, {c['time_us']} us")


def wait_for_line(node: Node, *words: str, timeout: float = NODE_TIMEOUT_S) -> str:
    """The first line of the node's stderr holding every word (read behind the run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in node.stderr().splitlines():
            if all(w in line for w in words):
                return line
        if node.proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"no line with {words} on {node.host.ns}:\n{node.stderr()[-3000:]}")


def test_a_node_lost_mid_run_fails_the_job_and_the_retry_resumes_bit_exact(
    hosts, root: str, tmp_path: Path
) -> None:
    settings = {"artifact_root": root, **BASE, **SAME_MATH, "max_steps": 16, "checkpoint_every": 4}
    whole = run_two_nodes(hosts, "train", {**settings, "run_id": "whole"}, tmp_path)
    for node in whole:
        assert node.proc.returncode == 0, node.stderr()[-3000:]

    command, container = batch_command("train", {**settings, "run_id": "lost"})
    main, child = hosts
    nodes = [
        start_node(h, i, main, command, container, tmp_path / f"lost-node{i}.log")
        for i, h in enumerate(hosts)
    ]
    try:
        wait_for_line(nodes[0], "checkpoint step", "committed")
        assert child.kill_all(), "node 1 had no process left to kill"  # the host is lost
        codes = [node.wait() for node in nodes]
    finally:
        for node in nodes:
            node.host.kill_all()
    assert codes[1] == -signal.SIGKILL
    # The main node's rank reads the lost peer's reset in its next all-reduce; the
    # launcher passes the worker's code on. Today that code is 1, a crash: Batch's
    # evaluateOnExit does not retry it and Airflow retries it per the task's policy. A
    # lost peer is a transient infrastructure fault (75) by the contract: when the job
    # maps it (see docs/RELIABILITY.md, "Multi-node across hosts"), this becomes 75.
    survivor = nodes[0].stderr()
    assert codes[0] == LOST_PEER_EXIT, survivor[-3000:]
    assert f"[{child.addr}]" in survivor and "by peer" in survivor, survivor[-3000:]
    assert f"exiting with its code {LOST_PEER_EXIT}" in survivor

    (tmp_path / "retry").mkdir()
    retry = run_two_nodes(hosts, "train", {**settings, "run_id": "lost"}, tmp_path / "retry")
    for node in retry:
        assert node.proc.returncode == 0, node.stderr()[-3000:]
    resumed = train_report(root, "lost")["resumed_from"]["step"]
    assert 4 <= resumed < 16
    print(f"node lost: main node exit {codes[0]}, retry resumed from step {resumed}")
    assert weights_sha256(root, "lost") == weights_sha256(root, "whole")


def test_a_main_node_whose_hostname_resolves_to_loopback_still_trains(
    hosts, root: str, tmp_path: Path
) -> None:
    # The machine's own /etc/hosts on the main node (hostname -> 127.0.0.1, as on many
    # hosts): the fallback gives loopback. Only the main node itself uses MASTER_ADDR
    # (the rendezvous store listens on every interface); gloo takes its address from
    # GLOO_SOCKET_IFNAME, so the child still reaches it over the veth.
    main = hosts[0]
    shutil.rmtree(netns.NETNS_ETC / main.ns)
    own = subprocess.run(main.argv(["hostname", "-i"]), capture_output=True, text=True)
    assert main.addr not in own.stdout.split(), own.stdout
    settings = {"artifact_root": root, **BASE, **SAME_MATH, "max_steps": 2, "run_id": "lo"}
    for node in run_two_nodes(hosts, "train", settings, tmp_path):
        assert node.proc.returncode == 0, node.stderr()[-3000:]
    assert train_report(root, "lo")["world_size"] == 2
