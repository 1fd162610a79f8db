"""The inductor options this library recommends for `torch.compile` of its modules.

On a CPU, inductor's default wrapper is Python: each call of the compiled step runs a few
hundred lines of it (allocations, size asserts, one call a kernel), about 350 us of an 8 x
32,000 step that takes 1.9 ms. `cpp_wrapper` compiles that wrapper to C++: the same kernels,
called from C++, at the cost of a longer first compile (README, "Using the sampler").

Before every call Dynamo checks the guards of the compiled step: about 600 of them, 85-90 us
on this CPU, 15% of a 1 x 151,936 step. Most check what no decode step changes: the
identity of torch's and this library's functions, the library's module constants, that no
instance attribute shadows a method. `skip_code_guards` drops those and keeps the rest
(the arguments, the sampler's own values and tensors): about 30 us.

On CUDA the step is replayed from a CUDA graph, where neither runs: nothing to add.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # torch._dynamo costs about a second to import: not for an annotation
    from torch._dynamo.types import GuardFilterEntry


def _on_code(entry: GuardFilterEntry) -> bool:
    """Whether a guard checks code rather than data: what no decode step changes."""
    kind, name = entry.guard_type, entry.name
    return (
        entry.is_global  # module constants, torch's functions
        # an attribute found on the class is not shadowed by the instance's __dict__
        or kind == "NOT_PRESENT_IN_GENERIC_DICT"
        # nor by a class earlier in the MRO; torch's pytree registry
        or (
            kind == "DICT_NOT_CONTAINS"
            and (name.endswith(".__dict__)") or name.startswith("__import__("))
        )
        # torch._dynamo.mark_dynamic on a tensor (never done to a sampler's inputs)
        or kind == "DIMENSION_DYNAMIC_MARKING_GUARD"
        # a function's code object, torch itself
        or (kind == "ID_MATCH" and (name.endswith(".__code__") or name.startswith("__import__(")))
    )


def skip_code_guards(guards: Sequence[GuardFilterEntry]) -> list[bool]:
    """A `guard_filter_fn` (True keeps a guard) that keeps the guards on the compiled
    call's arguments and on the objects they reach (a sampler's config, its stages, a
    processor's own state, tensors' dtypes and shapes) and drops those on code: globals
    (module constants, torch's functions), the identity of function code, method
    shadowing, dynamic-shape marks.

    What it gives up: a library function or constant patched after compiling is not seen
    (the compiled step goes on running the old code). What it keeps: a call with other
    arguments (`commit=False`, a commit mask, logits of another shape or dtype), a sampler
    of another config or a processor whose host state changed fails a guard and compiles
    again, as without the filter (tests/test_compile_options.py, test_graph_safety.py)."""
    return [not _on_code(entry) for entry in guards]


def compile_options(
    device: torch.device | str,
) -> dict[str, str | int | bool | Callable[..., Any]]:
    """`options=` for `torch.compile(sampler.forward, fullgraph=True, options=...)` on
    `device`: on a CPU {"cpp_wrapper": True, "guard_filter_fn": skip_code_guards}, {}
    elsewhere."""
    if torch.device(device).type != "cpu":
        return {}
    return {"cpp_wrapper": True, "guard_filter_fn": skip_code_guards}
