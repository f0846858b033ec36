"""The compile job (``python -m embedfresh.jobs.compile``) on every backend it can run here.

cpu: torch.compile's cache entry (mega-cache + inductor archive) is stored, a train run
in a fresh process with an empty inductor directory restores it and starts warm, and the
same key again is a cache hit. xla: the trial reports its graph count. neuron: a
test-only stand-in for ``neuron_parallel_compile`` on PATH records what it was given.
"""

from __future__ import annotations

import json
import os
import platform
import stat
import sys
from pathlib import Path

import pytest

from embedfresh.core import cpuinfo, layout, markers
from embedfresh.core.config import DEFAULT_NEURON_CC_FLAGS, CompileConfig, TrainConfig
from embedfresh.core.storage import ArtifactStore
from embedfresh.ml.compile import neuron_env, torch_cache
from embedfresh.ml.compile.neuron import parse_summary
from tests.compile_cache import CompileCache
from tests.conftest import DAY2, run_job

XLA_ENV = {"PJRT_DEVICE": "CPU"}
X86 = platform.machine() in ("x86_64", "AMD64")


def _report(root: str, run_id: str, kind: str = "compile", model: str = "tiny") -> dict:
    return ArtifactStore(root).read_json(layout.report(model, run_id, kind))


def test_cpu_compile_stores_restores_and_hits(
    root: str, tmp_path: Path, cpu_compile_cache: CompileCache
) -> None:
    # The compile: the compile tests' shared one (tests/compile_cache.py), one process,
    # its entry in a compile_cache_root of its own; this test restores it and hits it.
    compiled = cpu_compile_cache.compiled
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    report = cpu_compile_cache.report()
    assert report["mode"] == "torch.compile" and report["cache_hit"] is False
    assert report["graphs"] >= 1 and report["compiles_after_warmup"] == 0
    cold = report["cold_seconds_to_first_step"]
    assert cold > 0 and report["warm_seconds_to_first_step"] is None
    entry = layout.compile_cache("cpu", report["key"])
    cache_root = cpu_compile_cache.cache
    cache = ArtifactStore(cache_root)
    assert markers.verify(cache, entry).ok
    assert report["cache_url"] == cache.url(entry)
    marker = markers.read_marker(cache, entry)
    # On x86 (this suite's hosts and CI's), unless the operator decides it
    # (TORCHINDUCTOR_VEC_ISA_OK): inductor's check of the CPU's vector ISAs ran before the
    # trial, all passed (g++ builds AVX2/AVX-512 test kernels), and the trial compiled as
    # a restore will.
    isa_checked = X86 and "TORCHINDUCTOR_VEC_ISA_OK" not in os.environ
    extra = {"vec-isa.json"} if isa_checked else set()
    assert set(marker["files"]) == {"mega-cache.bin", "inductor-cache.tar.gz", *extra}
    if isa_checked:
        vec_isa = report["vec_isa"]
        assert vec_isa["offered"] and vec_isa["valid"] == vec_isa["offered"], vec_isa
        assert vec_isa["vec_isa_ok"] is True and vec_isa["check_seconds"] > 0
        # Each ISA's test build is recorded (the AVX512-BF16 one too on hosts that have it).
        built = {key.split("|", 1)[0] for key in vec_isa["builds"]}
        assert built >= set(vec_isa["valid"]) and all(vec_isa["builds"].values()), vec_isa
    assert report["size_bytes"] == sum(f["size"] for f in marker["files"].values()) > 0
    assert report["created_at"].endswith("Z")
    # the trial trained in a throwaway store: nothing of it in the real one, nor in the
    # cache's, which holds the entry alone
    store = ArtifactStore(cpu_compile_cache.root)
    assert not store.exists("runs/tiny/c1-compile-trial")
    assert not store.exists("models/tiny/versions/c1-compile-trial")
    assert not store.exists("compile-cache")
    in_cache = cpu_compile_cache.cache_path
    files = {p.relative_to(in_cache).parts[0] for p in in_cache.rglob("*") if p.is_file()}
    assert files == {"compile-cache"}, files

    fresh = tmp_path / "fresh-inductor"
    trained = run_job(
        "train",
        f"artifact_root={root}",
        f"compile_cache_root={cache_root}",
        "run_id=t1",
        "compile=on",
        f"data_interval_start={DAY2}",
        "max_steps=4",
        env={"TORCHINDUCTOR_CACHE_DIR": str(fresh)},
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    train_report = _report(root, "t1", "train")
    cache = train_report["compile"]["cache"]
    assert cache["hit"] is True and cache["key"] == report["key"]
    assert any(fresh.iterdir()), "the inductor archive was not extracted into the fresh dir"
    assert train_report["compiles_after_warmup"] == 0
    # The warm start skipped the ISA check and still found every graph: inductor's config
    # is in its cache keys, so setting vec_isa_ok on this side alone would miss them all.
    assert cache["vec_isa_check_skipped"] is isa_checked
    if isa_checked:  # and its extension test builds were answered from the entry (the
        # base check of each ISA, one build each, is what vec_isa_ok skips)
        vec_isa = report["vec_isa"]
        extensions = len(vec_isa["builds"]) - len(vec_isa["valid"])
        assert cache["vec_isa_builds_answered"] == extensions, (cache, vec_isa)
        # The AVX512-BF16 extension is built where the CPU has it (an AVX-512 Xeon
        # without it builds none).
        bf16 = "avx512_bf16" in cpuinfo.field("flags").split()
        assert extensions >= 1 or not bf16 or "avx512" not in vec_isa["valid"], vec_isa
    found = train_report["compile"]["graph_cache"]
    assert found["autograd_cache_hits"] >= 1, found
    assert found["autograd_cache_misses"] == found["autograd_cache_guard_misses"] == 0, found
    # (How much sooner a warm start steps is a benchmark's figure, bench/compile.py.)

    again = run_job(
        "compile", f"artifact_root={root}", f"compile_cache_root={cache_root}", "run_id=c2",
        "compile=on",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    hit = _report(root, "c2")
    assert hit["cache_hit"] is True and hit["key"] == report["key"]
    assert hit["created_at"] == report["created_at"]  # the entry was not rewritten
    assert "cache hit" in json.loads(again.stdout)["message"]


def test_eager_has_nothing_to_compile(root: str) -> None:
    done = run_job("compile", f"artifact_root={root}", "run_id=e1", "compile=off")
    assert done.returncode == 0, done.stderr[-3000:]
    report = _report(root, "e1")
    assert report["mode"] == "eager" and report["graphs"] == 0
    assert report["message"].startswith("eager: nothing to compile")
    assert not ArtifactStore(root).exists(layout.compile_cache("cpu", report["key"]))


def test_xla_trial_reports_graph_count(root: str) -> None:
    done = run_job("compile", f"artifact_root={root}", "run_id=x1", "backend=xla", env=XLA_ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    report = _report(root, "x1")
    assert report["mode"] == "xla-trace" and report["cache_hit"] is False
    # forward+backward, optimizer init, steady update, evaluation's graphs
    assert report["graphs"] >= 3
    assert report["compiles_after_warmup"] == 0
    assert "cannot be read back" in report["note"]
    assert markers.verify(ArtifactStore(root), layout.compile_cache("xla", report["key"])).ok


STAND_IN = """#!{python}
import json, os, sys
argv = sys.argv[1:]
config = argv[argv.index("--config") + 1]
record = {{"argv": argv, "env": dict(os.environ), "config": json.load(open(config))}}
with open({record!r}, "a") as f:
    f.write(json.dumps(record) + "\\n")
print("2024-08-11 23:04:08.000738: INFO ||PARALLEL_COMPILE||: Total graphs: 7")
print("2024-08-11 23:04:08.000738: INFO ||PARALLEL_COMPILE||: Total successful compilations: {ok}")
print("2024-08-11 23:04:08.000738: INFO ||PARALLEL_COMPILE||: Total failed compilations: {failed}")
"""


def _stand_in(bin_dir: Path, record: Path, failed: int = 0) -> dict[str, str]:
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "neuron_parallel_compile"
    tool.write_text(
        STAND_IN.format(python=sys.executable, record=str(record), ok=7 - failed, failed=failed)
    )
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_neuron_trial_runs_under_neuron_parallel_compile(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "calls.jsonl"
    flags = "--target trn1 --optlevel 2"
    sets = (
        f"artifact_root={root}",
        "run_id=n1",
        "backend=neuron",
        "batch_size=16",
        f"neuron_cc_flags={flags}",
    )
    done = run_job(
        "compile", *sets, "neuron_max_retries=3", env=_stand_in(tmp_path / "bin", record)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(calls) == 1
    call = calls[0]
    assert call["argv"][:4] == [sys.executable, "-m", "embedfresh.jobs.train", "--config"]

    # The real training run: what the train job sets before the Neuron runtime starts.
    real = TrainConfig.model_validate(
        {**dict(s.split("=", 1) for s in sets), "data_interval_start": str(DAY2)}
    )
    from embedfresh.ml.training import prepare_compile

    with monkeypatch.context() as patch:
        patch.setattr(os, "environ", {})
        info = prepare_compile(real, "neuron")
        train_env = dict(os.environ)
    assert info["mode"] == "neuron_parallel_compile"
    assert train_env == neuron_env(real)
    cache_url = f"{ArtifactStore(root).path('compile-cache/neuron')}"
    assert train_env == {"NEURON_CC_FLAGS": flags, "NEURON_COMPILE_CACHE_URL": cache_url}
    for name, value in train_env.items():
        assert call["env"][name] == value
    assert call["env"]["NEURON_PARALLEL_COMPILE_MAX_RETRIES"] == "3"

    # The trial command trains the real run's config, shortened, in a throwaway store.
    trial = TrainConfig.model_validate(call["config"])
    shortened = {
        "artifact_root",
        "run_id",
        "max_steps",
        "eval_every",
        "eval_queries",
        "checkpoint_every",
        "init",
        "data_interval_end",
        "compile_cache_root",
    }
    assert trial.model_dump(exclude=shortened) == real.model_dump(exclude=shortened)
    assert trial.compile_cache_root == ArtifactStore(root).root
    assert trial.artifact_root != real.artifact_root
    assert (trial.max_steps, trial.eval_every, trial.checkpoint_every) == (5, 5, 4)
    assert trial.eval_queries == 64  # its evaluation's graphs count, not its figures
    assert neuron_env(trial) == neuron_env(real)

    report = _report(root, "n1")
    assert report["mode"] == "neuron_parallel_compile" and report["graphs"] == 7
    assert report["summary"] == {"graphs": 7, "succeeded": 7, "failed": 0}
    assert report["cache_url"] == cache_url and report["cache_hit"] is False

    again = run_job("compile", *sets, env=_stand_in(tmp_path / "bin", record))
    assert again.returncode == 0, again.stderr[-3000:]
    assert _report(root, "n1")["cache_hit"] is True
    assert len(record.read_text().splitlines()) == 1  # not run again


def test_neuron_failed_graphs_fail_the_job(root: str, tmp_path: Path) -> None:
    env = _stand_in(tmp_path / "bin", tmp_path / "calls.jsonl", failed=2)
    done = run_job("compile", f"artifact_root={root}", "run_id=n2", "backend=neuron", env=env)
    assert done.returncode == 1
    assert "2 of 7 graphs failed" in done.stderr
    assert not ArtifactStore(root).exists("compile-cache/neuron")


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("compile=maybe",), "Input should be 'auto', 'on' or 'off'"),
        (("backend=tpu",), "unknown backend 'tpu'"),
        (("trial_steps=1",), "trial_steps"),
        (("backend=neuron", "neuron_parallel_compile=no-such-tool-here"), "not on PATH"),
        (("dataset=nothing",), "no training partition"),
    ],
)
def test_bad_config_exits_2(root: str, sets: tuple[str, ...], message: str) -> None:
    done = run_job("compile", f"artifact_root={root}", "run_id=bad", *sets)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr
    assert not ArtifactStore(root).exists("compile-cache")


def test_parse_summary_takes_the_last_one() -> None:
    text = (
        "x ||PARALLEL_COMPILE||: Total graphs: 3\n"
        "x ||PARALLEL_COMPILE||: Total successful compilations: 3\n"
        "x ||PARALLEL_COMPILE||: Total failed compilations: 0\n"
        "2023-05-08 20:14:50.000983: INFO ||PARALLEL_COMPILE||: Total graphs: 26\n"
        "2023-05-08 20:14:50.000983: INFO ||PARALLEL_COMPILE||: Total successful compilations: 25\n"
        "2023-05-08 20:14:50.000983: INFO ||PARALLEL_COMPILE||: Total failed compilations: 1\n"
    )
    assert parse_summary(text) == {"graphs": 26, "succeeded": 25, "failed": 1}
    assert parse_summary("no summary here") is None


def test_cache_key_changes_with_shapes_and_flags() -> None:
    from embedfresh.ml.compile import cache_key

    base = CompileConfig(artifact_root="file:///nowhere")
    key = cache_key(base, "neuron", "neuron_parallel_compile")
    assert key == cache_key(
        CompileConfig(artifact_root="file:///x"), "neuron", "neuron_parallel_compile"
    )
    for changed in (
        base.model_copy(update={"batch_size": 8}),
        base.model_copy(update={"model": "minilm"}),
        base.model_copy(update={"neuron_cc_flags": DEFAULT_NEURON_CC_FLAGS + " --verbose"}),
    ):
        assert cache_key(changed, "neuron", "neuron_parallel_compile") != key
    assert cache_key(base, "xla", "xla-trace") != key


class _Isa:
    """An ISA as inductor's ``cpu_vec_isa`` has them: a name, flags, ``check_build``."""

    _arch_flags = "-mavx512f"

    def __init__(self) -> None:
        self.built: list[str] = []

    def __str__(self) -> str:
        return "avx512"

    def check_build(self, code: str) -> bool:
        self.built.append(code)
        return "fails" not in code


def test_isa_test_builds_are_recorded_then_answered_without_building(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch._inductor import cpu_vec_isa

    isa = _Isa()
    builds: dict[str, bool] = {}
    with torch_cache._recording_builds([isa], builds):
        assert isa.check_build("bf16 code") is True
        isa._arch_flags += " -mavx512bf16"  # inductor adds an extension's flag to build it
        assert isa.check_build("code that fails") is False
        isa._arch_flags = "-mavx512f"
    assert "check_build" not in vars(isa) and len(builds) == 2, builds

    fresh = _Isa()  # the restoring process's own instance
    monkeypatch.setattr(cpu_vec_isa, "supported_vec_isa_list", [fresh])
    answered: dict[str, int] = {}
    torch_cache._replay_builds(builds, answered)
    assert fresh.check_build("bf16 code") is True
    fresh._arch_flags += " -mavx512bf16"
    assert fresh.check_build("code that fails") is False
    assert fresh.built == [] and answered["vec_isa_builds_answered"] == 2  # from the record
    fresh._arch_flags = "-mavx512f -mother"  # flags it has no record for: built
    assert fresh.check_build("bf16 code") is True and fresh.built == ["bf16 code"]
    assert answered["vec_isa_builds_answered"] == 2
    # Another compiler is another build: inductor's own fingerprint is in the key.
    fresh._arch_flags = "-mavx512f"
    monkeypatch.setattr(
        cpu_vec_isa, "_get_isa_dry_compile_fingerprint", lambda flags: f"clang 99={flags}"
    )
    assert fresh.check_build("bf16 code") is True and len(fresh.built) == 2
