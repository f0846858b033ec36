"""The pieces of sharded training that need no second process: DCP through the artifact
store (:mod:`embedfresh.ml.parallel.store_dcp`), the sharding plan's checks, the
transformer blocks it shards, rank-named fault points, and the config's refusals."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
import torch.distributed.checkpoint as dcp
from pydantic import ValidationError
from torch.distributed.checkpoint import CheckpointException

from embedfresh.core.config import TrainConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore, faults
from embedfresh.ml.backends import sharding_refusal
from embedfresh.ml.model import versions
from embedfresh.ml.model.presets import get_spec
from embedfresh.ml.parallel.sharding import Sharding, checkpoint_blocks, transformer_blocks
from embedfresh.ml.parallel.store_dcp import METADATA, StoreReader, StoreWriter, rank_file


def _reasons(error: CheckpointException) -> str:
    """What each rank's failure said (DCP wraps them, one per rank)."""
    return " | ".join(str(failure[0]) for failure in error.failures.values())


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "w": torch.randn(7, 5, generator=g),
        "half": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "step": torch.tensor(12.0),  # a 0-dim tensor, as AdamW's step
        "ids": torch.arange(10, dtype=torch.int64).reshape(2, 5),
    }


def test_a_state_dict_round_trips_through_the_store_without_pickle(tmp_path) -> None:
    store = ArtifactStore(f"file://{tmp_path}")
    saved = _state()
    writer = StoreWriter(store, "ck")
    dcp.save(saved, storage_writer=writer)  # no process group: one rank
    assert sorted(writer.files) == sorted([rank_file(0), METADATA])
    for name, (sha, size) in writer.files.items():
        data = (tmp_path / "ck" / name).read_bytes()
        assert len(data) == size and sha == hashlib.sha256(data).hexdigest()
    # The metadata is JSON, the shards raw bytes: nothing to unpickle.
    doc = json.loads((tmp_path / "ck" / METADATA).read_text())
    assert doc["tensors"]["half"]["dtype"] == "bfloat16" and doc["objects"] == []
    raw = sum(t.numel() * t.element_size() for t in saved.values())
    assert (tmp_path / "ck" / rank_file(0)).stat().st_size == raw  # bare tensor bytes

    loaded = {k: torch.zeros_like(v) for k, v in saved.items()}
    dcp.load(loaded, storage_reader=StoreReader(store, "ck"))
    for k, v in saved.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), k


def test_a_pickled_object_is_refused_on_save_and_on_load(tmp_path) -> None:
    store = ArtifactStore(f"file://{tmp_path}")
    with pytest.raises(CheckpointException) as refused:
        dcp.save(
            {"w": torch.ones(2), "groups": [{"lr": 0.1}]}, storage_writer=StoreWriter(store, "a")
        )
    assert "tensors only" in _reasons(refused.value)
    assert not (tmp_path / "a" / METADATA).exists()
    # A checkpoint whose metadata names an object (another writer's) is refused, unread.
    dcp.save({"w": torch.ones(2)}, storage_writer=StoreWriter(store, "b"))
    doc = json.loads((tmp_path / "b" / METADATA).read_text())
    doc["objects"] = ["groups"]
    (tmp_path / "b" / METADATA).write_text(json.dumps(doc))
    with pytest.raises(CheckpointException) as refused:
        dcp.load({"w": torch.zeros(2), "groups": []}, storage_reader=StoreReader(store, "b"))
    assert "asks to unpickle groups" in _reasons(refused.value)


def test_a_truncated_shard_is_refused_not_loaded_short(tmp_path) -> None:
    store = ArtifactStore(f"file://{tmp_path}")
    dcp.save(_state(), storage_writer=StoreWriter(store, "ck"))
    shard = tmp_path / "ck" / rank_file(0)
    shard.write_bytes(shard.read_bytes()[:-8])
    loaded = {k: torch.zeros_like(v) for k, v in _state().items()}
    with pytest.raises(CheckpointException) as refused:
        dcp.load(loaded, storage_reader=StoreReader(store, "ck"))
    assert "bytes at" in _reasons(refused.value)


def test_the_sharding_plan_refuses_what_no_launch_can_run() -> None:
    assert Sharding.plan("ddp", 4, "cpu") is None
    fsdp = Sharding.plan("fsdp", 4, "cpu")
    assert fsdp.mesh_shape == (4,) and fsdp.param_dtype is None
    assert Sharding.plan("fsdp", 2, "cuda").param_dtype == torch.bfloat16  # auto on cuda
    assert Sharding.plan("fsdp", 2, "cuda", mixed_precision="fp32").param_dtype is None
    hsdp = Sharding.plan("hsdp", 4, "cpu", shard_size=2)
    assert hsdp.mesh_shape == (2, 2)
    assert hsdp.describe()["mesh"] == {"replicate": 2, "shard": 2}
    with pytest.raises(BadInputError, match="one process.*nproc_per_node >= 2"):
        Sharding.plan("fsdp", 1, "cpu")
    with pytest.raises(BadInputError, match="world size 4 is not a multiple of it"):
        Sharding.plan("hsdp", 4, "cpu", shard_size=3)


def test_hsdp_groups_default_to_the_processes_of_one_node(monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert Sharding.plan("hsdp", 6, "cpu").mesh_shape == (3, 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(BadInputError, match="world size 6"):
        Sharding.plan("hsdp", 6, "cpu")


def test_torch_xla_backends_refuse_sharding_naming_their_route() -> None:
    assert sharding_refusal("cpu") is None
    assert "NeuronX Distributed" in sharding_refusal("neuron")
    assert "ZeRO-1" in sharding_refusal("neuron")
    assert "XlaFullyShardedDataParallel" in sharding_refusal("xla")


def test_the_config_refuses_settings_that_do_not_go_together() -> None:
    with pytest.raises(ValidationError, match="compile=on"):
        TrainConfig(parallelism="fsdp", compile="on")
    with pytest.raises(ValidationError, match="shard_size applies to parallelism=hsdp"):
        TrainConfig(parallelism="fsdp", shard_size=2)
    with pytest.raises(ValidationError, match="mixed_precision applies"):
        TrainConfig(mixed_precision="bf16")


@pytest.mark.parametrize(
    ("model_type", "block"),
    [("qwen3", "Qwen3DecoderLayer"), ("llama", "LlamaDecoderLayer"), ("mpnet", "MPNetLayer"),
     ("distilbert", "TransformerBlock")],
)  # fmt: skip
def test_blocks_are_the_layer_stack_of_every_encoder_kind(model_type: str, block: str) -> None:
    from transformers import AutoConfig, AutoModel

    fields = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4}
    if model_type == "distilbert":
        fields = {"dim": 32, "hidden_dim": 64, "n_heads": 4, "n_layers": 3}
    else:
        fields["num_hidden_layers"] = 3
    hf = AutoModel.from_config(AutoConfig.for_model(model_type, vocab_size=100, **fields))
    assert [type(b).__name__ for b in transformer_blocks(hf)] == [block] * 3


def test_the_own_bert_encoders_blocks_are_its_layers() -> None:
    spec = get_spec("tiny")
    blocks = transformer_blocks(versions.build_model(spec, 0))
    assert [type(b).__name__ for b in blocks] == ["BertLayer"] * spec.encoder.num_hidden_layers


def test_activation_checkpointing_changes_no_number(tmp_path) -> None:
    spec = get_spec("tiny")
    ids = torch.randint(1, 1000, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    grads = []
    for wrapped in (False, True):
        model = versions.build_model(spec, 0)
        if wrapped:
            assert checkpoint_blocks(model) == spec.encoder.num_hidden_layers
        torch.manual_seed(1)  # dropout on: the recompute must replay the same masks
        model.train()
        model.embed(ids, mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.equal(grads[0][name], grads[1][name]), name


def test_each_rank_names_and_kills_only_its_own_fault_points(monkeypatch, tmp_path) -> None:
    log = tmp_path / "points.log"
    monkeypatch.setenv(faults.WRITES_LOG, str(log))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(faults, "_count", 0)
    # The other rank's point: this process neither kills nor calls it drifted.
    monkeypatch.setenv(faults.FAULT_POINT, "rank0: 1 write a/b")
    faults.after_write("write", "a/b")
    assert log.read_text().splitlines() == ["rank1: 1 write a/b"]
    monkeypatch.setenv(faults.FAULT_POINT, "rank1: 2 write a/other")
    with pytest.raises(RuntimeError, match="drifted"):
        faults.after_write("write", "a/c")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert faults.point_name(3, "put", "x/y", faults.process_rank()) == "3 put x/y"
