"""What a program spends outside its tile loops: the rounds of dependent global loads its
warps wait for, and the instructions they issue, on the longest path through its SASS.

Why: the tile loops' formula (machine.launch_time) charges nothing for a kernel's prologue
(the slot, then the slot's parameters, then the tables they index), its sparse phases (the
bias ids, then the logits at those ids, then the tile maxima to update) or a merge after
its loop. At a small batch these chains are most of a launch: a program that loads a value
only to find the address of the next load waits a memory latency each time, however few
bytes it moves.

How: a warp issues in order, so an instruction issues no earlier than the latest-ready
operand of any instruction before it. Walking the code in address order, the model keeps
`progress`, the loads the warp has waited for so far, and for each register the round its
value is ready in: an instruction's sources lift `progress` to their round; a global load
(LDG, an atomic, LD) issued at `progress` p gives a value ready in round p + 1; anything else
gives a value ready at p. At a forward branch the state goes to the target too, and where
paths meet the later round of each register (and of `progress`) holds: the longest path.
Branches back (loop iterations) are not followed, so a loop that is not a tile loop counts
once, unless the access table counts its iterations (`work.Work.trips`, charged as a tile
loop is). Loads inside a tile loop or a counted one, and the asynchronous copies (LDGSTS)
that start a pipelined one, add no round: the tile-loop formula already charges each
iteration's wait; their instructions are not counted here either. A loop the access table
runs zero times (the redo pass, the radix search of a settled row, the blocks of a sparse
table past its first when no row fills them) is left out with the innermost `if` around it
(`_never_run`), and so is the block of an `if` the access table takes no row through
(`_untaken_blocks`: the commit's path for a byte at 254 or 255), and the else-block of one
it takes every row through (sampling's `if covered:` where every row is covered: the
uncovered rows' arrival and merge).

Limits: the longest path is an upper bound where a rarely taken block holds a load; every
load costs a full memory latency (no cache); a barrier is taken as all warps arriving
together (they run the same code)."""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass

from .sass import _BRANCH, Loop, parse

_NO_DESTINATION = {
    "STG", "STS", "ST", "STL", "RED", "REDG", "BAR", "DEPBAR", "LDGDEPBAR", "BRA", "EXIT",
    "NOP", "WARPSYNC", "MEMBAR", "FENCE", "CCTL", "ERRBAR", "BSSY", "BSYNC", "CALL", "RET",
    "YIELD", "LDGSTS", "BPT", "JMP", "BRX",
}  # fmt: skip
_GLOBAL_LOADS = {"LDG", "LD", "ATOMG", "ATOM"}
_REGISTER = re.compile(r"(?<![\w.])(U?R\d+|U?P\d)(\.64|\.128)?(?!\w)")
_GUARD = re.compile(r"@(!?)(U?P\w+)\s+(.*)")
_UNTRACKED = {"RZ", "URZ", "PT", "UPT"}


@dataclass(frozen=True)
class StraightLine:
    """A program's longest path outside its tile loops."""

    load_rounds: int  # dependent global loads waited for, one after another
    instructions: int  # issued by each warp


def _registers(operand: str) -> list[str]:
    """The registers an operand names, a 64- or 128-bit one as its 2 or 4 halves."""
    found = []
    for match in _REGISTER.finditer(operand):
        name, width = match.group(1), {".64": 2, ".128": 4}.get(match.group(2) or "", 1)
        numbered = re.fullmatch(r"(U?R)(\d+)", name)
        if numbered:
            first = int(numbered.group(2))
            found += [f"{numbered.group(1)}{first + i}" for i in range(width)]
        else:
            found.append(name)
    return found


def _destinations(opcode: str, operand: str) -> list[str]:
    """The registers an instruction's first operand writes: as many as its width (.64,
    .128, a .WIDE multiply) from a register."""
    names = _registers(operand)
    if not names:
        return []
    numbered = re.fullmatch(r"(U?R)(\d+)", names[0])
    if not numbered:
        return names
    wide = ".64" in opcode or ".WIDE" in opcode or "F64" in opcode or opcode.startswith("D")
    width = 4 if ".128" in opcode else 2 if wide else 1
    return [f"{numbered.group(1)}{int(numbered.group(2)) + i}" for i in range(width)]


def _never_run(
    code: list[tuple[int, str]], labels: dict[str, int], loops: list[Loop],
    unwalked: Collection[tuple[str, int]],
) -> list[tuple[int, int]]:  # fmt: skip
    """(first, last) offsets of the blocks left out: for each loop at (file, line) in
    `unwalked`, the innermost forward branch's block around the outermost loop holding it
    (a search's passes: the `while` around the walk), or that loop alone. That block is the
    `if` guarding the loop, or the loop's own zero-trip guard, which leaves the code before
    the loop in: what runs only with the loop, a few setup instructions, may be counted.
    A block holding an EXIT is no such `if`: it ends the program, and leaving it out would
    leave out the path to the program's end (seen where processing's sparse phases were the
    then-block of an if/else: ptxas had placed their step-7 walk inside it, unguarded)."""
    exits = [offset for offset, text in code if re.search(r"\bEXIT\b", text)]
    forward = []
    for offset, text in code:
        branch = _BRANCH.search(text)
        if branch and _GUARD.match(text) and labels.get(branch.group(1), 0) > offset:
            forward.append((offset + 16, labels[branch.group(1)] - 16))
    blocks = []
    for loop in loops:
        if (loop.file, loop.line) in unwalked:
            first, last = min(
                ((o.head, o.end) for o in loops if o.head <= loop.head and loop.end <= o.end),
                key=lambda r: r[0],
            )
            around = [
                (a, b)
                for a, b in forward
                if a <= first and last <= b and not any(a <= e <= b for e in exits)
            ]
            blocks.append(min(around, key=lambda r: r[1] - r[0], default=(first, last)))
    return blocks


def _untaken_blocks(
    parsed: list[tuple[int, str, str, int]], labels: dict[str, int],
    untaken: Collection[tuple[str, int]], always: Collection[tuple[str, int]] = (),
) -> list[tuple[int, int]]:  # fmt: skip
    """(first, last) offsets of the blocks that a guarded forward branch at the line of an
    `if` in `untaken` (file name, line) jumps over: that `if`'s block, which no program
    runs. A range holding an EXIT is no such block (a cold path placed out of line), and is
    kept. For an `if` in `always`, whose block every program runs: its else-block, the
    block the then-block's last instruction (an unconditional branch) jumps over, where an
    early exit (a guarded EXIT) may lie."""
    exits = [offset for offset, text, *_ in parsed if re.search(r"\bEXIT\b", text)]
    ends = [offset for offset, text, *_ in parsed if re.match(r"EXIT\b", text)]  # unguarded
    at_offset = {offset: text for offset, text, *_ in parsed}
    blocks = []
    for offset, text, file, line in parsed:
        branch = _BRANCH.search(text)
        if not branch or not _GUARD.match(text):
            continue
        target = labels.get(branch.group(1), 0)
        if target <= offset:
            continue  # a loop's back edge
        where = (os.path.basename(file), line)
        if where in untaken and not any(offset < e < target for e in exits):
            blocks.append((offset + 16, target - 16))
        jump = _BRANCH.search(at_offset.get(target - 16, ""))
        if where in always and jump and re.match(r"BRA\b", at_offset[target - 16]):
            beyond = labels.get(jump.group(1), 0)
            if beyond > target and not any(target <= e < beyond for e in ends):
                blocks.append((target, beyond - 16))
    return blocks


def straight_line(
    sass: str, loops: list[Loop], unwalked: Collection[tuple[str, int]] = (),
    untaken: Collection[tuple[str, int]] = (), counted: Collection[tuple[str, int]] = (),
    always: Collection[tuple[str, int]] = (),
) -> StraightLine:  # fmt: skip
    """The module docstring's walk over `sass` (nvdisasm output) with its `loops`
    (`sass.find_loops`); `unwalked`: the (file, line) of loops no program runs; `untaken`:
    the (file, line) of `if`s whose block no program runs (a rare path); `counted`: the
    (file, line) of loops charged by their iterations (`work.Work.trips`), left out as
    the tile loops are; `always`: the (file, line) of `if`s whose block every program runs,
    their else-blocks left out. An untaken `if` whose block ends the program, compiled as
    a guarded EXIT at its line, ends the path there."""
    parsed, labels = parse(sass)
    code = [(offset, text) for offset, text, *_ in parsed]
    tiles = [
        (loop.head, loop.end)
        for loop in loops
        if loop.tile_loop or (loop.file, loop.line) in counted
    ]
    skipped = _never_run(code, labels, loops, unwalked)
    skipped += _untaken_blocks(parsed, labels, untaken, always)
    # an untaken `if` that ends the program, compiled as an exit guarded by its negation
    # (processing's sparse phases, which a deferred row skips): every program exits there
    exiting = {
        offset
        for offset, text, file, line in parsed
        if re.search(r"\bEXIT\b", text) and _GUARD.match(text)
        and (os.path.basename(file), line) in untaken
    }  # fmt: skip
    incoming: dict[int, list[dict[str, int]]] = {}
    state: dict[str, int] = {"progress": 0, "issued": 0}
    live, ends = True, []
    for offset, text in code:
        if offset in incoming:
            paths = incoming.pop(offset) + ([state] if live else [])
            state = {}
            for path in paths:
                for name, value in path.items():
                    state[name] = max(state.get(name, 0), value)
            live = True
        if not live or any(first <= offset <= last for first, last in skipped):
            continue
        guard = None
        if guarded := _GUARD.match(text):
            if guarded.group(2) in ("PT", "UPT") and guarded.group(1) == "!":
                continue  # @!PT: never issued (padding)
            guard, text = guarded.group(2), guarded.group(3)
        opcode, _, rest = text.partition(" ")
        base = opcode.split(".")[0]
        operands = [o.strip() for o in rest.split(",")] if rest.strip() else []
        sources = [guard] if guard and guard != "PT" else []
        written: list[str] = []
        if base in _NO_DESTINATION or not operands:
            sources += [r for o in operands for r in _registers(o)]
        elif re.fullmatch(r"U?P(\d|T)", operands[0]):  # a compare (two predicates), SHFL's
            written = [r for o in operands[:2] for r in _registers(o)]
            sources += [r for o in operands[2:] for r in _registers(o)]
        else:
            written = _destinations(opcode, operands[0])
            others = operands[1:]
            # carries out (LEA, IADD3: one or two predicates)
            while others and len(written) < 4 and re.fullmatch(r"U?P\d", others[0]):
                written, others = [*written, others[0]], others[1:]
            sources += [r for o in others for r in _registers(o)]
        in_tile_loop = any(first <= offset <= last for first, last in tiles)
        if not in_tile_loop:
            state["issued"] += 1
        progress = max([state["progress"]] + [state.get(r, 0) for r in sources])
        state["progress"] = progress
        if base == "BRA":
            branch = _BRANCH.search(text)
            target = labels.get(branch.group(1)) if branch else None
            if target is not None and target > offset:
                incoming.setdefault(target, []).append(dict(state))
            # BRA.DIV (a warp-divergence check) branches on an operand, not a guard
            live = guard is not None or opcode != "BRA"
            continue
        if base == "EXIT":
            ends.append(dict(state))
            live = guard is not None and offset not in exiting
            continue
        ready = progress + (base in _GLOBAL_LOADS and not in_tile_loop)
        for name in written:
            if name not in _UNTRACKED:
                state[name] = ready
    if live:
        ends.append(state)
    return StraightLine(
        max((end["progress"] for end in ends), default=0),
        max((end["issued"] for end in ends), default=0),
    )
