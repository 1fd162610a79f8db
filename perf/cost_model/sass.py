"""A recorded launch compiled for sm_90 with its own specialization: registers and spills
(`ptxas -v`), shared memory (the compiled metadata) and the loops of its SASS (`nvdisasm`).

Triton is imported inside the functions: tests/cuda_compile.py must be imported first (it
turns the interpreter off), which perf/kernel_model.py's `build_model` does."""

from __future__ import annotations

import ast
import linecache
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

ARCH = 90

_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
_LABEL = re.compile(r"^\s*(\.L\w+):")
_INSTRUCTION = re.compile(r"/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\b.*`\((\.L\w+)\)")
# a walk over the row's tiles: the whole row, or a program's chunk of it (split rows; its
# whole tiles and its partial last one apart, in processing and the radix search), or the
# chunk's tiles listed by `library.tiles_to_visit` (one iteration a listed tile)
TILE_LOOP = re.compile(
    r"for \w+ in (tl\.)?range\((0, (vocab_size|full_end)|begin, (pass_)?end|begin, full_end"
    r"|full_end, (pass_)?end), "
    r"BLOCK_SIZE\b"
    r"|for \w+ in tl\.range\(0, visits\b"
)
"""A kernel's walk over its row's tiles, as every kernel in kernels/ writes it."""


@dataclass
class Loop:
    """One SASS loop: from a label to the last branch back to it."""

    file: str
    line: int  # of the branch back: the loop statement's line
    source: str
    instructions: int  # static, head to back edge (per thread, per iteration)
    tile_loop: bool
    # loads copied asynchronously into shared memory (LDGSTS, `cp.async`): a software-pipelined
    # loop, whose next tiles' loads are in flight while one is computed
    pipelined: bool = False
    elements_per_thread: float | None = None  # BLOCK_SIZE / (32 × warps), tile loops
    instructions_per_element: float | None = None
    walks_per_row: float = 0.0  # the most any program walks it (tile loops)
    trips: float = 0.0  # the most iterations any program makes (a counted loop, work.Work)
    head: int = 0  # offsets of the body's first and last instruction (16 bytes each)
    end: int = 0
    # forward conditional branches within the body: (file, line of the `if`, first, last
    # offset of the instructions they jump over, its then-block)
    branches: list[tuple[str, int, int, int]] = field(default_factory=list)
    # the else-blocks of those branches: (file, line of the `if`, first, last offset), the
    # block the then-block's last instruction (an unconditional branch) jumps over
    else_blocks: list[tuple[str, int, int, int]] = field(default_factory=list)
    expected_instructions: float | None = None  # with the access table's branch fractions

    def instructions_with(self, taken: dict[tuple[str, int], float]) -> float:
        """The body's instructions a thread issues an iteration when the branch at (file,
        line) runs its block in a fraction of the iterations (1 for any branch not named),
        and its else-block in the rest: each instruction weighed by the product of the
        fractions of the blocks holding it."""
        weighed = [
            (first, last, taken[(where, at)])
            for where, at, first, last in self.branches
            if (where, at) in taken
        ] + [
            (first, last, 1.0 - taken[(where, at)])
            for where, at, first, last in self.else_blocks
            if (where, at) in taken
        ]
        total = 0.0
        for offset in range(self.head, self.end + 16, 16):
            weight = 1.0
            for first, last, fraction in weighed:
                if first <= offset <= last:
                    weight *= fraction
            total += weight
        return total


def parse(sass: str) -> tuple[list[tuple[int, str, str, int]], dict[str, int]]:
    """`nvdisasm -c -g` output -> ([(offset, instruction, file, line)] in address order, the
    offset each label marks)."""
    labels: dict[str, int] = {}
    pending: list[str] = []
    code: list[tuple[int, str, str, int]] = []
    file, line = "", 0
    for text in sass.splitlines():
        if located := _LINE.search(text):
            file, line = located.group(1), int(located.group(2))
        elif label := _LABEL.match(text):
            pending.append(label.group(1))
        elif ins := _INSTRUCTION.search(text):
            offset = int(ins.group(1), 16)
            labels.update(dict.fromkeys(pending, offset))
            pending = []
            code.append((offset, ins.group(2), file, line))
    return code, labels


def find_loops(
    sass: str, num_warps: int, block_size: int | None, source_dir: Path | None = None
) -> list[Loop]:
    """The loops of `nvdisasm -c -g` output (file and line from its line info): a branch to
    an earlier label, one loop per label, unless an EXIT lies between the two: that is a
    cold path placed after the body (a warp-divergence fallback after `BRA.DIV`) rejoining
    it, and Triton's structured control flow never exits from inside a loop. The
    branch-to-itself that pads the end of a function is not a loop either.

    A loop's source line is read from `source_dir` / the line info's file name where that
    file exists. Triton's cache keys a kernel by its source and first line, not its path,
    so a cubin from the cache names the file of whichever checkout compiled it first, which
    may since hold other lines; the line numbers are this source's."""
    code, labels = parse(sass)
    ends: dict[int, tuple[int, str, int]] = {}  # head -> back edge: offset, file, line
    exits = [offset for offset, text, *_ in code if re.search(r"\bEXIT\b", text)]
    for offset, text, where, at in code:
        branch = _BRANCH.search(text)
        head = labels.get(branch.group(1), offset) if branch else offset
        if head < offset and not any(head <= e <= offset for e in exits):
            ends[head] = (offset, where, at)
    loops = []
    named = {os.path.basename(file) for *_, file, _ in code}
    for head, (end, where, at) in sorted(ends.items()):
        source = linecache.getline(_source_file(where, source_dir), at).strip()
        if source_dir is not None and not _LOOP_HEADER.match(source):
            where, source = _loop_header_at(at, where, source, source_dir, named)
        body = [text for offset, text, *_ in code if head <= offset <= end]
        pipelined = any(re.search(r"\bLDGSTS\b", text) for text in body)
        # a predicated branch forward to a label inside the body skips the block between
        branches: list[tuple[str, int, int, int]] = []
        else_blocks: list[tuple[str, int, int, int]] = []
        at_offset = {offset: text for offset, text, *_ in code}
        for offset, text, file, line in code:
            branch = _BRANCH.search(text)
            if branch and head <= offset < end and re.match(r"@!?U?P\w+\s+BRA\b", text):
                target = labels.get(branch.group(1), offset)
                if offset < target <= end:
                    line = _if_line(file, line, source_dir)
                    name = os.path.basename(file)
                    # the block jumped over is the then-block, and the block after it, where
                    # it ends with a jump over one, the else-block; or the other way round
                    # where the compiler laid the else-block out first (its source lines
                    # tell), the then-block at the target (a tail shared with another `if`
                    # is left whole where no jump bounds it)
                    skipped = [(f, n) for o, _, f, n in code if offset < o < target]
                    first, second = branches, else_blocks
                    if _skips_else(file, line, skipped, source_dir):
                        first, second = else_blocks, branches
                    first.append((name, line, offset + 16, target - 16))
                    last = at_offset.get(target - 16, "")
                    jump = _BRANCH.search(last)
                    if jump and re.match(r"BRA\b", last.strip()):
                        beyond = labels.get(jump.group(1), target)
                        if target < beyond <= end:
                            second.append((name, line, target, beyond - 16))
        loop = Loop(
            os.path.basename(where), at, source, len(body), bool(TILE_LOOP.search(source)),
            pipelined, head=head, end=end, branches=branches, else_blocks=else_blocks,
        )  # fmt: skip
        if loop.tile_loop and block_size:
            loop.elements_per_thread = block_size / (32 * num_warps)
            loop.instructions_per_element = round(len(body) / loop.elements_per_thread, 2)
        loops.append(loop)
    return loops


_LOOP_HEADER = re.compile(r"(for|while)\b")


def _loop_header_at(
    line: int, recorded: str, source: str, source_dir: Path, named: Collection[str]
) -> tuple[str, str]:
    """(file, source) of a loop whose back edge's line info names a line that is no loop
    statement: nvdisasm writes a `//## File` only where the line changes, so a back edge on
    line L right after an instruction inlined from line L of another file (a helper's
    store, say) keeps that file. The one kernel file of `source_dir` that the line info
    names somewhere (`named`: the kernel's code is in it) and that holds a loop statement at
    line L, where exactly one does; else the recorded one (a loop rotated so that no
    instruction keeps its statement's line: the cut kernel's `while searching:`)."""
    found = [
        path
        for path in sorted(source_dir.glob("*.py"))
        if path.name in named and _LOOP_HEADER.match(linecache.getline(str(path), line).strip())
    ]
    if len(found) != 1:
        return recorded, source
    return str(found[0]), linecache.getline(str(found[0]), line).strip()


@cache
def _if_bodies(path: str) -> dict[int, tuple[range, range]]:
    """Each `if` statement's line in a source file -> the line ranges of its then- and
    else-blocks (an empty range without an else)."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError):
        return {}
    bodies = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            then = range(node.body[0].lineno, (node.body[-1].end_lineno or 0) + 1)
            orelse = node.orelse
            other = (
                range(orelse[0].lineno, (orelse[-1].end_lineno or 0) + 1) if orelse else range(0)
            )
            bodies[node.lineno] = (then, other)
    return bodies


def _skips_else(
    recorded: str, line: int, skipped: list[tuple[str, int]], source_dir: Path | None
) -> bool:
    """Whether the block a branch of the `if` on `line` jumps over is that `if`'s else-block:
    more of its instructions from the `if`'s own file lie in the else-block's lines than in
    the then-block's."""
    path = _source_file(recorded, source_dir)
    bodies = _if_bodies(path).get(line)
    if bodies is None:
        return False
    then, other = bodies
    name = os.path.basename(recorded)
    own = [n for f, n in skipped if os.path.basename(f) == name]
    return sum(n in other for n in own) > sum(n in then for n in own)


def _if_line(recorded: str, line: int, source_dir: Path | None) -> int:
    """The line of the `if` a conditional branch recorded on `line` belongs to: `line`
    itself, or where that is a block's last statement and the next code line an `if`, that
    line (the compiler folds a block's end into the next `if`'s branch, which then keeps
    the line info of the statement before it)."""
    path = _source_file(recorded, source_dir)
    if re.match(r"\s*(if|elif|while)\b", linecache.getline(path, line)):
        return line
    below = line + 1
    while (text := linecache.getline(path, below)) and re.match(r"\s*(#|$)", text):
        below += 1
    return below if re.match(r"\s*if\b", text) else line


def _source_file(recorded: str, source_dir: Path | None) -> str:
    """The file a line info names, in `source_dir` when it holds one of that name."""
    if source_dir is not None and (source_dir / os.path.basename(recorded)).is_file():
        return str(source_dir / os.path.basename(recorded))
    return recorded


# ---------------------------------------------------------------------------- compiling


@dataclass
class Variant:
    """One compiled kernel variant: what ptxas, the metadata and the SASS say."""

    num_warps: int
    registers: int
    spill_bytes: int
    shared_bytes: int
    loops: list[Loop]
    seconds: float
    sass: str = field(default="", repr=False)  # nvdisasm's text, for cost_model.chain
    _paths: dict[tuple[frozenset[tuple[str, int]], ...], Any] = field(
        default_factory=dict, repr=False
    )

    def straight_line(
        self,
        unwalked: Collection[tuple[str, int]],
        untaken: Collection[tuple[str, int]] = (),
        counted: Collection[tuple[str, int]] = (),
        always: Collection[tuple[str, int]] = (),
    ) -> Any:
        """`chain.straight_line` of this variant's SASS (a `chain.StraightLine`), once for
        each set of unwalked loops, untaken `if`s, counted loops and `if`s always taken."""
        from .chain import straight_line

        key = (frozenset(unwalked), frozenset(untaken), frozenset(counted), frozenset(always))
        if key not in self._paths:
            self._paths[key] = straight_line(self.sass, self.loops, *key)
        return self._paths[key]


def _tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def _disassemble(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run(
            [_tool("nvdisasm"), "-c", "-g", str(path)],
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
    return proc.stdout


class Compiler:
    """Compiles each distinct variant once (by kernel, signature, constexprs and options)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.variants: dict[str, Variant] = {}

    def get(self, launch: Any) -> Variant:
        from cuda_compile import compile_with_ptxas_log, ptxas_usage
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.jit import create_function_from_signature

        kernel = launch.kernel
        target = GPUTarget("cuda", ARCH, 32)
        backend = make_backend(target)
        # The launch's own specialization, as JITFunction.run computes it on a GPU: pointers
        # 16-byte aligned and ints divisible by 16 become hints that vectorise the loads.
        # cuda_compile's plain signature (no hints) would count scalar loads instead.
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        bound, specialization, options = binder(**launch.args, **launch.options)
        kwargs = {**launch.constexprs, **launch.options}
        parsed, signature, constexprs, attrs = kernel._pack_args(
            backend, kwargs, bound, specialization, options
        )
        key = f"{kernel.__name__} {specialization} {sorted(launch.options.items())}"
        if key in self.variants:
            return self.variants[key]
        start = time.perf_counter()
        src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled, log = compile_with_ptxas_log(src, target, parsed.__dict__)
        registers, spills = ptxas_usage(log)
        if registers is None:
            raise RuntimeError(f"ptxas -v gave no register count for {kernel.__name__}")
        block = launch.constexprs.get("BLOCK_SIZE")
        sass = _disassemble(compiled.asm["cubin"])
        variant = Variant(
            compiled.metadata.num_warps, registers, spills or 0, compiled.metadata.shared,
            find_loops(sass, compiled.metadata.num_warps, block, Path(kernel.file_name).parent),
            round(time.perf_counter() - start, 2), sass,
        )  # fmt: skip
        self.variants[key] = variant
        constants = " ".join(f"{k}={v}" for k, v in launch.constexprs.items())
        self.log(f"compiled {kernel.__name__} {constants} num_warps={variant.num_warps}: "
                 f"{variant.seconds:.1f} s, {registers} registers")  # fmt: skip
        return variant


def pipeline_stages() -> int:
    """The kernels' software-pipeline depth on their tile loops (kernels/library.py)."""
    from graphsafe_sampler.kernels.library import PIPELINE_STAGES

    return int(PIPELINE_STAGES.value)


def loop_stages(source: str) -> int:
    """A tile loop's pipeline depth, from its line's `num_stages=`: a literal or a constant
    of kernels/library.py (PIPELINE_STAGES, LISTED_STAGES); PIPELINE_STAGES if it names
    none."""
    from graphsafe_sampler.kernels import library

    found = re.search(r"num_stages=(\w+)", source)
    if found is None:
        return pipeline_stages()
    name = found.group(1)
    return int(name) if name.isdigit() else int(getattr(library, name).value)
