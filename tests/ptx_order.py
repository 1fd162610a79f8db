"""Where a kernel's PTX waits for the grids before it (programmatic dependent launch,
kernels/dependent_launch.py): text functions only, so that the test process (the
interpreter's) can check them on hand-written PTX, and tests/cuda_compile.py on every
variant's."""

from __future__ import annotations

import re

_MEMORY_OPS = ("ld", "st", "atom", "red", "cp", "prefetch", "multimem", "mbarrier")
_LOCAL_SPACES = {"shared", "param", "local", "const"}


def _may_touch_global(code: str) -> bool:
    """Whether the PTX instruction `code` may read or write global memory: a load, store,
    atomic, reduction, copy or prefetch that names the global state space, or names none
    (generic addressing may reach it)."""
    mnemonic = re.sub(r"^@!?%\w+\s+", "", code).split(None, 1)[0] if code else ""
    parts = mnemonic.split(".")
    if parts[0] not in _MEMORY_OPS:
        return False
    return "global" in parts or not _LOCAL_SPACES.intersection(parts)


def waits_first(ptx: str) -> bool | None:
    """Whether the kernel's `griddepcontrol.wait` comes before its first instruction that may
    touch global memory and before any branch (so every path through the kernel passes it
    first): False where such an instruction or a branch comes first (or there is no wait),
    None where the kernel has neither. A PDL launch may start while the kernel before it
    runs: only after the wait are that kernel's stores visible, and its loads done."""
    body = ptx[ptx.find(".entry") :]
    for text in body.splitlines()[1:]:
        code = text.split("//")[0].strip()
        if code.startswith("griddepcontrol.wait"):
            return True
        if _may_touch_global(code) or re.match(r"(@!?%\w+\s+)?bra(\.uni)?\s", code):
            return False
    return None
