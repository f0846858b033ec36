"""``/proc/cpuinfo``, read in one place: the first processor's fields by name.

Read by the packed forward's GEMM choice (``vendor_id``), the compile cache's key on cpu
(``flags``: inductor builds with ``-march=native``) and the benchmarks' machine line
(``model name``). Where there is no such file (macOS) or field, a field reads "".
"""

from __future__ import annotations

import functools

PATH = "/proc/cpuinfo"


def field(*names: str) -> str:
    """The value of the first of ``names`` that the first processor's block has ("" when
    none does): ``field("vendor_id")`` -> ``"AuthenticAMD"``; ``field("flags",
    "Features")`` gives the feature flags on x86 and on ARM."""
    fields = _first_processor()
    for name in names:
        if name in fields:
            return fields[name]
    return ""


@functools.cache
def _first_processor() -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        with open(PATH, encoding="ascii", errors="replace") as info:
            for line in info:
                if not line.strip():
                    if fields:
                        break  # the end of the first processor's block
                    continue
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields
