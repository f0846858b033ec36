"""The compile job under the launch train runs under: ``torchrun --nproc-per-node 2``.

cpu/inductor: a 2-process compile trains its trial data parallel and rank 0 alone
stores the entry under a key of world size 2, next to the 1-process entry of the
compile tests' shared cache (tests/compile_cache.py, copied into its store); a 2-process
DDP train with ``compile=on`` then restores it (both ranks into one inductor directory)
and compiles nothing new, while a 1-process train looks for the 1-process key and finds
that entry. neuron: rank 0 alone runs ``neuron_parallel_compile`` around the trial's own
2-process launch, with torchrun's variables of the compile job's launch left out.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from embedfresh.core import layout, markers
from embedfresh.core.config import TrainConfig
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.compile.launch import Launch, child_env
from tests.compile_cache import CompileCache
from tests.conftest import DAY2, ROOT, job_env
from tests.test_compile_job import _stand_in


def launched(
    job: str, *sets: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m embedfresh.jobs.<job>`` started as the local runner starts a job with
    ``nproc_per_node=2`` (``JobSpec.argv``: the launcher, ``--standalone``)."""
    cmd = [sys.executable, "-m", "embedfresh.jobs.launch", "--standalone"]
    cmd += ["--nproc-per-node", "2", "-m", f"embedfresh.jobs.{job}"]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(
        cmd, cwd=ROOT, env=job_env(env), capture_output=True, text=True, timeout=600
    )


def _report(root: str, run_id: str, kind: str) -> dict:
    return ArtifactStore(root).read_json(layout.report("tiny", run_id, kind))


# Inductor's vector-ISA check skipped on both sides (the operator's choice, which the
# job honours): ~30 s of test builds on this box, covered by test_compile_job.py.
ISA = {"TORCHINDUCTOR_VEC_ISA_OK": "1"}


@dataclass(frozen=True)
class TwoProcessCompile:
    """The 2-process compile (run c2) in ``root``, its entry in the root's own compile
    cache, where a copy of the compile tests' shared cache put the 1-process entry
    (``one``) before."""

    root: str
    one: subprocess.CompletedProcess
    one_key: str | None
    compiled: subprocess.CompletedProcess

    def ok(self) -> dict:
        """The compile's report, once both compiles are known to have run."""
        assert self.one.returncode == 0, self.one.stderr[-3000:]
        assert self.compiled.returncode == 0, self.compiled.stderr[-3000:]
        return _report(self.root, "c2", "compile")


@pytest.fixture(scope="module")
def two_process_compile(
    cpu_compile_cache_session: CompileCache,
    data_template: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> TwoProcessCompile:
    """Compiled once for the three tests below, which read it."""
    store = tmp_path_factory.mktemp("two-process-compile") / "artifacts"
    shutil.copytree(data_template, store)
    shared = cpu_compile_cache_session
    one_key = None
    if shared.compiled.returncode == 0:
        shared.copy_into(store)
        one_key = shared.report()["key"]
    root = f"file://{store}"
    compiled = launched("compile", f"artifact_root={root}", "run_id=c2", "compile=on", env=ISA)
    return TwoProcessCompile(root, shared.compiled, one_key, compiled)


def test_two_process_compile_stores_one_entry_under_a_key_of_world_size_2(
    two_process_compile: TwoProcessCompile,
) -> None:
    report = two_process_compile.ok()
    # The 1-process entry is there already: another key, so this launch compiles.
    assert report["mode"] == "torch.compile" and report["cache_hit"] is False
    assert report["world_size"] == 2 and report["key_parts"]["world_size"] == 2
    assert report["key_parts"]["parallelism"] == "ddp"
    assert report["graphs"] >= 1 and report["compiles_after_warmup"] == 0
    store = ArtifactStore(two_process_compile.root)
    entry = layout.compile_cache("cpu", report["key"])
    assert markers.verify(store, entry).ok
    # Rank 0 alone wrote: the entry, the report and the result record, once.
    assert "compiled:" in report["message"]
    record = store.read_json(layout.result("tiny", "c2", "compile"))
    assert record["summary"]["key"] == report["key"] and record["summary"]["cache_hit"] is False
    assert sorted(store.listdir(layout.compile_cache_backend("cpu"))) == sorted(
        [two_process_compile.one_key, report["key"]]
    )
    assert not store.exists("runs/tiny/c2-compile-trial")


def test_a_two_process_ddp_train_restores_the_entry_and_compiles_nothing(
    two_process_compile: TwoProcessCompile, root: str, tmp_path: Path
) -> None:
    report = two_process_compile.ok()
    fresh = tmp_path / "fresh-inductor"  # both ranks restore into this one directory
    trained = launched(
        "train",
        f"artifact_root={root}",
        f"compile_cache_root={two_process_compile.root}",  # the entry in another store
        "compile=on",
        "run_id=t2",
        f"data_interval_start={DAY2}",
        "max_steps=4",
        env={**ISA, "TORCHINDUCTOR_CACHE_DIR": str(fresh)},
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    train = _report(root, "t2", "train")
    assert train["world_size"] == 2
    cache = train["compile"]["cache"]
    assert cache["hit"] is True and cache["key"] == report["key"], cache
    assert train["compiles_after_warmup"] == 0
    found = train["compile"]["graph_cache"]
    assert found["autograd_cache_hits"] >= 1, found
    assert found["autograd_cache_misses"] == found["autograd_cache_guard_misses"] == 0, found


def test_a_one_process_train_looks_up_the_one_process_entry(
    two_process_compile: TwoProcessCompile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-process train keys world size 1: the train job's own lookup misses the
    2-process entry and finds the 1-process compile's. (The lookup only: a hit's restore
    would load the entry into this test process; the train runs restore in theirs.)"""
    from embedfresh.ml.compile import torch_cache
    from embedfresh.ml.training import prepare_compile

    report = two_process_compile.ok()
    entries = ArtifactStore(two_process_compile.root)  # the train's own store holds both
    looked_up = []

    def lookup(store: ArtifactStore, backend: str, key: str) -> dict:
        looked_up.append((store.root, backend, key))
        return {"key": key, "hit": markers.verify(store, layout.compile_cache(backend, key)).ok}

    monkeypatch.setattr(torch_cache, "restore", lookup)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    single = TrainConfig.model_validate(
        {"artifact_root": entries.root, "run_id": "t1", "compile": "on",
         "data_interval_start": DAY2}
    )  # fmt: skip
    info = prepare_compile(single, "cpu")
    assert info["mode"] == "torch.compile"
    one_key = two_process_compile.one_key
    assert looked_up == [(entries.root, "cpu", one_key)] and one_key != report["key"]
    assert info["cache"] == {"key": one_key, "hit": True}


def test_neuron_compile_wraps_the_trials_torchrun_launch(root: str, tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    sets = (f"artifact_root={root}", "run_id=n2", "backend=neuron", "batch_size=16")
    done = launched("compile", *sets, env=_stand_in(tmp_path / "bin", record))
    assert done.returncode == 0, done.stderr[-3000:]
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(calls) == 1, "only rank 0 runs neuron_parallel_compile"
    argv, env = calls[0]["argv"], calls[0]["env"]
    # neuron_parallel_compile <the launch train runs under>: 2 processes on this node.
    assert argv[:9] == [
        sys.executable, "-m", "embedfresh.jobs.launch", "--standalone",
        "--nproc-per-node", "2", "-m", "embedfresh.jobs.train", "--config",
    ]  # fmt: skip
    assert TrainConfig.model_validate(calls[0]["config"]).max_steps == 5
    # torchrun's variables of the compile job's own launch are not passed on.
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        assert name not in env, name
    assert not [k for k in env if k.startswith("TORCHELASTIC_")]
    assert env["NEURON_CC_FLAGS"] and env["NEURON_COMPILE_CACHE_URL"].endswith(
        "compile-cache/neuron"
    )
    report = _report(root, "n2", "compile")
    assert report["world_size"] == 2 and report["key_parts"]["world_size"] == 2
    assert report["graphs"] == 7 and report["command"] == [
        str(tmp_path / "bin" / "neuron_parallel_compile"),
        *argv,
    ]

    again = launched("compile", *sets, env=_stand_in(tmp_path / "bin", record))
    assert again.returncode == 0, again.stderr[-3000:]
    assert _report(root, "n2", "compile")["cache_hit"] is True
    assert len(record.read_text().splitlines()) == 1  # not run again, on any rank


def test_trial_launch_follows_the_jobs_launch() -> None:
    one = Launch.from_env({})
    assert (one.world_size, one.is_main, one.distributed) == (1, True, False)
    assert one.trial_command("py", "embedfresh.jobs.train", ["--config", "c"]) == [
        "py", "-m", "embedfresh.jobs.train", "--config", "c",
    ]  # fmt: skip
    # 2 nodes x 8 processes, the second node's first rank (AWS Batch multi-node).
    env = {
        "WORLD_SIZE": "16", "RANK": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8",
        "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x", "PATH": "/bin",
    }  # fmt: skip
    node = Launch.from_env(env)
    assert (node.nodes, node.node_rank, node.is_main, node.is_node_main) == (2, 1, False, True)
    assert node.trial_command("py", "m", [], master=("10.0.0.1", 4000)) == [
        "py", "-m", "embedfresh.jobs.launch", "--nnodes", "2", "--node-rank", "1",
        "--master-addr", "10.0.0.1", "--master-port", "4000", "--nproc-per-node", "8", "-m", "m",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="master"):
        node.trial_command("py", "m", [])
    assert child_env(env) == {"PATH": "/bin"}


def test_other_ranks_take_rank_zeros_isa_check_on_the_same_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from embedfresh.ml.compile import torch_cache

    rank0 = {"offered": ["avx512", "avx2"], "valid": ["avx512", "avx2"], "vec_isa_ok": True}
    own = {"offered": ["avx2"], "checked_here": True}
    offered = {"value": ["avx512", "avx2"]}

    def checks(run: bool) -> dict:
        assert not run, "the ISAs' test builds ran"
        return {"offered": offered["value"]}

    monkeypatch.setattr(torch_cache, "vec_isa_checks", checks)
    monkeypatch.setattr(torch_cache, "check_vec_isa", lambda: own)
    assert torch_cache.same_cpu_vec_isa(rank0) is rank0
    offered["value"] = ["avx2"]  # another CPU: this rank checks its own
    assert torch_cache.same_cpu_vec_isa(rank0) is own
    failed = {**rank0, "valid": ["avx2"], "vec_isa_ok": False}  # not every ISA passed
    assert torch_cache.same_cpu_vec_isa(failed) is own


def test_ranks_restore_into_one_inductor_dir_file_by_whole_file(tmp_path: Path) -> None:
    import io
    import tarfile
    import threading

    from embedfresh.ml.compile import torch_cache

    files = {"fxgraph/ab/entry": b"x" * 200_000, "aotautograd/cd/entry": b"y" * 1000}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    target = tmp_path / "inductor"
    target.mkdir()

    def restore() -> None:
        with tarfile.open(fileobj=io.BytesIO(buffer.getvalue())) as tar:
            torch_cache._extract(tar, str(target))

    ranks = [threading.Thread(target=restore) for _ in range(4)]
    for rank in ranks:
        rank.start()
    seen = []
    while any(rank.is_alive() for rank in ranks):  # a reader never sees a partial file
        path = target / "fxgraph/ab/entry"
        if path.exists():
            seen.append(len(path.read_bytes()))
    for rank in ranks:
        rank.join()
    assert set(seen) <= {200_000}
    assert {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()} == set(files)
    assert (target / "aotautograd/cd/entry").read_bytes() == files["aotautograd/cd/entry"]
