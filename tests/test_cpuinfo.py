"""``embedfresh.core.cpuinfo``: the one reader of ``/proc/cpuinfo`` (the packed forward's
GEMM choice, the compile cache's cpu key, the benchmarks' machine line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedfresh.core import cpuinfo
from embedfresh.ml.compile import key

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 avx2 avx512f hypervisor
vmx flags\t: ept

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: another block
flags\t\t: fpu sse2
"""
ARM = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd sve bf16 cpuid
"""


@pytest.fixture
def cpuinfo_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def write(text: str | None) -> None:
        path = tmp_path / "cpuinfo"
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)
        monkeypatch.setattr(cpuinfo, "PATH", str(path))
        cpuinfo._first_processor.cache_clear()

    yield write
    cpuinfo._first_processor.cache_clear()


def test_fields_of_the_first_processor_by_name(cpuinfo_file):
    cpuinfo_file(X86)
    assert cpuinfo.field("vendor_id") == "AuthenticAMD"  # not the second block's
    assert cpuinfo.field("model name") == "AMD EPYC 9R14"
    assert cpuinfo.field("flags", "Features") == "fpu sse2 avx2 avx512f hypervisor"
    assert cpuinfo.field("nothing") == ""
    # The cache key hashes instruction-set flags only: hypervisor and vmx do not count.
    with_isa = key.cpu_flags_digest()
    cpuinfo_file(X86.replace(" hypervisor", ""))
    assert key.cpu_flags_digest() == with_isa
    cpuinfo_file(X86.replace(" avx512f", ""))
    assert key.cpu_flags_digest() not in ("", with_isa)


def test_arm_features_and_no_file(cpuinfo_file):
    cpuinfo_file(ARM)
    assert cpuinfo.field("flags", "Features") == "fp asimd sve bf16 cpuid"
    assert key.cpu_flags_digest() != ""
    cpuinfo_file(None)  # macOS: no /proc/cpuinfo
    assert cpuinfo.field("vendor_id") == "" and key.cpu_flags_digest() == ""
