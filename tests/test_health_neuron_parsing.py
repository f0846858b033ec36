"""Parsing of the Neuron tools' real output formats (``neuron-ls -j``, ``nccom-test``),
from the samples in ``tests/fixtures/neuron`` (sources in its README), and clear
errors on output that is not those formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embedfresh.ml.health.neuron_tools import (
    NeuronOutputError,
    core_count,
    parse_nccom_test,
    parse_neuron_ls,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "neuron"


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_neuron_ls_trn1_2xlarge_capture() -> None:
    (device,) = parse_neuron_ls(_text("neuron-ls-trn1.2xlarge.json"))
    assert device["neuron_device"] == 0 and device["nc_count"] == 2
    assert device["memory_size"] == 32 * 1024**3  # bytes, not "32 GB"
    assert device["connected_to"] == []  # null on a single-device instance
    assert device["bdf"] == "0000:00:1e.0" and device["neuroncore_ids"] == [0, 1]
    assert core_count([device]) == 2


def test_neuron_ls_trn1_32xlarge_topology() -> None:
    devices = parse_neuron_ls(_text("neuron-ls-trn1.32xlarge.json"))
    assert [d["neuron_device"] for d in devices] == list(range(16))
    assert core_count(devices) == 32
    assert devices[5]["connected_to"] == [1, 4, 9, 6]  # the docs' topology table
    # NeuronLink neighbours are symmetric on the 4x4 torus.
    links = {(d["neuron_device"], n) for d in devices for n in d["connected_to"]}
    assert all((b, a) in links for a, b in links)


def test_core_count_falls_back_to_nc_count_without_core_ids() -> None:
    entry = json.loads(_text("neuron-ls-trn1.2xlarge.json"))[0]
    del entry["neuroncore_ids"]
    entry["nc_count"] = 8
    assert core_count(parse_neuron_ls(json.dumps([entry, entry]))) == 16


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "did not print JSON"),
        ("+--------+--------+\n| NEURON | NEURON |", "did not print JSON"),
        ('{"instance_type": "trn2.48xlarge", "devices": []}', "--output-format json"),
        ("[]", "no Neuron device"),
        ("[3]", "not an object"),
        ('[{"neuron_device": 0, "memory_size": 1}]', "'nc_count' must be an integer"),
        ('[{"neuron_device": 0, "nc_count": "2", "memory_size": 1}]', "'nc_count'"),
        ('[{"neuron_device": 0, "nc_count": 2, "memory_size": "32 GB"}]', "'memory_size'"),
        ('[{"neuron_device": 0, "nc_count": 2, "memory_size": 1, "connected_to": 4}]',
         "connected_to"),
    ],
)  # fmt: skip
def test_neuron_ls_malformed_output_is_a_clear_error(text: str, words: str) -> None:
    with pytest.raises(NeuronOutputError, match=words.replace("(", r"\(")):
        parse_neuron_ls(text)


def test_nccom_quick_validation() -> None:
    out = parse_nccom_test(_text("nccom-test-allr-quick.txt"))
    assert out["failed"] is False and out["errors"] == []
    assert out["rows"] == [
        {"size_bytes": 33554432, "count": 33554432, "type": "uint8", "time_us": 768.0,
         "algbw_gibps": 40.69, "busbw_gibps": 40.69},
    ]  # fmt: skip
    assert out["avg_busbw_gibps"] == 40.6901


def test_nccom_size_sweep() -> None:
    out = parse_nccom_test(_text("nccom-test-allr-sweep.txt"))
    sizes = [r["size_bytes"] for r in out["rows"]]
    assert sizes == [1024 * 4**i for i in range(11)]  # 1 KiB .. 1 GiB, step 4x
    assert all(r["type"] == "fp32" and r["count"] * 4 == r["size_bytes"] for r in out["rows"])
    assert out["rows"][-1]["busbw_gibps"] == 52.83 and out["avg_busbw_gibps"] == 23.6671
    # The documented average is the mean of the busbw column.
    mean = sum(r["busbw_gibps"] for r in out["rows"]) / len(out["rows"])
    assert mean == pytest.approx(out["avg_busbw_gibps"], abs=0.01)


def test_nccom_all_gather_with_check_keeps_its_indentation() -> None:
    out = parse_nccom_test(_text("nccom-test-allg-check.txt"))
    assert [r["size_bytes"] for r in out["rows"]] == [1024, 8192, 65536, 524288]
    assert out["rows"][2]["algbw_gibps"] == 0.41 and out["rows"][2]["busbw_gibps"] == 0.39
    assert out["avg_busbw_gibps"] == 0.7731 and not out["failed"]


def test_nccom_failed_size_is_reported_not_parsed_as_a_row() -> None:
    out = parse_nccom_test(_text("nccom-test-failed-size.txt"))
    assert out["failed"] is True and out["rows"] == []
    assert any("Failure running neuron-bench" in e for e in out["errors"])
    assert out["errors"][-1] == "1 errors found - test failed"


def test_nccom_host_problem_before_any_table() -> None:
    out = parse_nccom_test(_text("nccom-test-no-driver.txt"))
    assert out["failed"] is True and out["rows"] == []
    assert out["errors"][0].startswith("Neuron DKMS Driver is not running!")


HEADER = "size(B)    count(elems)    type    time(us)    algbw(GB/s)    busbw(GB/s)"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "printed nothing"),
        ("usage: nccom-test [-h] ...", "no result table"),
        (HEADER, "no result row"),
        (f"{HEADER}\n1024 256 fp32 58 0.02", "5 columns, expected 6"),
        (f"{HEADER}\n1024 256 fp32 58 0.02 fast", "busbw 'fast' is not a number"),
        (f"{HEADER}\nabc 256 fp32 58 0.02 0.02", "size 'abc' is not a number"),
    ],
)
def test_nccom_malformed_output_is_a_clear_error(text: str, words: str) -> None:
    with pytest.raises(NeuronOutputError, match=words):
        parse_nccom_test(text)
