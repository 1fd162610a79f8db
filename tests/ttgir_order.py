"""The order of a kernel's global stores, barriers and releasing atomics in its TTGIR (which
stores a barrier orders, which a barrier and then an acq_rel atomic release to another
program): text functions only, so that the test process (the interpreter's) can check them
on hand-written TTGIR, and tests/cuda_compile.py on every variant's."""

from __future__ import annotations

import re
from collections.abc import Iterator


def _split(text: str, sep: str) -> list[str]:
    """`text` split at each `sep` outside brackets and quotes."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif ch in "([<":
            depth += 1
        elif ch in ")]>":
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
    parts.append(text[start:])
    return parts


def _source_line(loc: str, aliases: dict[str, str]) -> int | None:
    """The kernel source line of an MLIR location, e.g. `#loc21` with `#loc21 =
    loc("kernels/x.py":120:9)`: a name location (`"x"(#loc5)`) or a fused one gives its
    (first) inner line, a call site its caller's, so an op inlined from a helper maps to the
    kernel line that calls it; None for `unknown`."""
    loc = loc.strip()
    if loc.startswith("#loc"):
        return _source_line(aliases[loc], aliases) if loc in aliases else None
    if file_loc := re.match(r'"[^"]*":(\d+):\d+', loc):
        return int(file_loc.group(1))
    if loc.startswith("callsite("):
        return _source_line(_split(loc[len("callsite(") : -1], " at ")[-1], aliases)
    if loc.startswith("fused"):
        inner = _split(loc[loc.index("[") + 1 : -1], ", ")
        return next((n for part in inner if (n := _source_line(part, aliases)) is not None), None)
    if name_loc := re.fullmatch(r'"[^"]*"\((.*)\)', loc):
        return _source_line(name_loc.group(1), aliases)
    return None


def _op_line(op: str, aliases: dict[str, str]) -> int:
    """The kernel source line of a TTGIR op's trailing `loc(...)`, 0 without one."""
    at = re.search(r" loc\((.*)\)$", op)
    return (_source_line(at.group(1), aliases) if at else None) or 0


def _aliases(ttgir: str) -> dict[str, str]:
    """The TTGIR's location aliases (`#loc21 = loc(...)`), for `_op_line`."""
    return dict(re.findall(r"^(#loc\d*) = loc\((.*)\)$", ttgir, re.MULTILINE))


_MEMORY_BARRIER = re.compile(r"ttg\.barrier (\S+)")


def _orders_memory(barrier: re.Match[str]) -> bool:
    """Whether a `ttg.barrier` orders global memory (`tl.debug_barrier()` is `ttg.barrier
    all` in Triton 3.9; a barrier names its address spaces: `local`, `global_write`, ...)."""
    return bool({"all", "global_write"} & set(barrier.group(1).split("|")))


def _walk_regions(ttgir: str) -> Iterator[tuple[str, tuple[int, ...], bool]]:
    """The kernel body's ops in text order, each with its region path (ids of the regions
    open around it, the tt.func's first) and whether every region on that path runs its
    ops at most once a program (the tt.func and `scf.if` branches; not a loop body, whose
    ops repeat)."""
    regions: list[tuple[int, bool]] = []  # (id, runs at most once)
    count, body = 0, None
    for line in ttgir.splitlines():
        op = line.strip()
        if op.startswith("}"):  # `} loc(...)`, `} else {`, `} do {`
            regions.pop()
            if body is not None and len(regions) < body:
                body = None
        if body is not None:
            once = all(single for _, single in regions[body - 1 :])
            yield op, tuple(i for i, _ in regions[body - 1 :]), once
        if op.endswith("{"):
            count += 1
            branch = "scf.if " in op or op.startswith("} else {")
            regions.append((count, branch or op.startswith("tt.func public")))
            if op.startswith("tt.func public"):
                body = len(regions)


def store_phases(ttgir: str) -> list[list[int]]:
    """The kernel's `tt.store`s in text order, each as [source line, phase]: barriers
    ordering global memory are numbered 1, 2, ... in text order, and a store's phase is
    the number of the last one on every path that reaches it (0 for none): the last before
    it in its own block or in a block enclosing it (the control flow is structured). A
    barrier counts past the `scf.if` regions that hold it for no store (the other branch
    may skip it), and a barrier in a loop body for none (an earlier iteration's stores come
    after it). So of two stores, the one first in the text and of the lower phase is
    ordered before the other by a barrier (test_kernels_compile_for_cuda.py's `_ordered`);
    phases alone, out of text order, say nothing. Order is under-reported, never invented.
    A store with no source line is line 0."""
    aliases = _aliases(ttgir)
    stores: list[list[int]] = []
    # the phase each open region was entered in: a barrier inside it counts for no store
    # after it closes
    entered: dict[int, int] = {}
    phase, barriers, path = 0, 0, ()
    for op, here, once in _walk_regions(ttgir):
        common = 0  # the regions still open since the last op
        while common < min(len(path), len(here)) and path[common] == here[common]:
            common += 1
        if common < len(path):  # regions closed: back to the outermost one's entry phase
            phase = entered[path[common]]
        for region in here[common:]:
            entered[region] = phase
        path = here
        if op.startswith("tt.store "):
            stores.append([_op_line(op, aliases), phase])
        elif once and (barrier := _MEMORY_BARRIER.match(op)) and _orders_memory(barrier):
            barriers += 1
            phase = barriers
    return stores


def fenced_stores(ttgir: str) -> list[int]:
    """The source lines of the `tt.store`s that a barrier ordering global memory follows
    before the program's next load (`tt.load` or an asynchronous copy), in text order at any
    nesting: a store the same program reads back (a tile list, `library.tiles_to_visit`)
    must be one, or another thread may load the entry before it lands. The pipeliner puts a
    walk's first loads before its loop, so they count as next."""
    aliases = _aliases(ttgir)
    fenced: list[int] = []
    pending: list[int] = []  # stores since the last barrier or load
    for line in ttgir.splitlines():
        op = line.strip()
        if op.startswith("tt.store "):
            pending.append(_op_line(op, aliases))
        elif (barrier := _MEMORY_BARRIER.match(op)) and _orders_memory(barrier):
            fenced += pending
            pending = []
        elif re.search(r"= (tt\.load|ttg\.async_copy_global_to_local) ", op):
            pending = []
    return sorted(set(fenced))


def released_stores(ttgir: str) -> list[int]:
    """The source lines of the `tt.store`s that a barrier ordering global memory, then an
    atomic that acquires and releases at GPU scope (`tt.atomic_rmw` acq_rel, gpu or sys),
    follow on every path to the atomic, neither in a loop body: the barrier in the store's
    block or one enclosing it and the atomic in the barrier's or one enclosing that (every
    path that stored passes both), or the atomic in the barrier's block or one inside it,
    after the store in text order (every path to the atomic passes the barrier, after any
    store before it: processing's dense pass, then its phases' `if` holding the arrival).
    Those are the stores another program may read once its own acq_rel atomic on the
    location reads this one's (`library.last_to_arrive`): without the barrier only the
    atomic's thread's stores would be released, and without the acquire the last
    program's loads may read stale lines."""
    aliases = _aliases(ttgir)
    released: list[int] = []
    pending: list[tuple[int, tuple[int, ...]]] = []  # (line, region path): no barrier yet
    fenced: list[tuple[int, tuple[int, ...]]] = []  # (line, the barrier's path)
    # (line, the path of a barrier after it in text order, not enclosing it)
    before: list[tuple[int, tuple[int, ...]]] = []
    atomic = re.compile(r"= tt\.atomic_rmw \w+, acq_rel, (gpu|sys),")
    for op, path, once in _walk_regions(ttgir):
        if op.startswith("tt.store "):
            pending.append((_op_line(op, aliases), path))
        elif once and (barrier := _MEMORY_BARRIER.match(op)) and _orders_memory(barrier):
            fenced += [(line, path) for line, at in pending if at[: len(path)] == path]
            before += [(line, path) for line, at in pending if at[: len(path)] != path]
            pending = [(line, at) for line, at in pending if at[: len(path)] != path]
        elif once and atomic.search(op):
            released += [line for line, at in fenced if at[: len(path)] == path]
            fenced = [(line, at) for line, at in fenced if at[: len(path)] != path]
            released += [line for line, at in before if path[: len(at)] == at]
    return sorted(set(released))
