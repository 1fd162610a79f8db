"""Speed-ups of the Triton interpreter (`TRITON_INTERPRET=1`) that leave its values as they
are: `share_interpreter_patches`, `scan_in_log_steps`, `skip_unasserted_overflow_checks` and
`cache_numpy_dtypes`. `speed_up_interpreter` installs all four (tests/conftest.py and the
GPU check's CPU smoke run call it).

`share_interpreter_patches`: the interpreter without its per-call re-patching.

Under `TRITON_INTERPRET=1` a kernel launch patches `triton.language` for numpy (its
builtins, `tl.tensor`'s methods, `tl.range`, `tl.reduce`, ...) and restores it when the
grid is done. Every call of a `@triton.jit` helper inside the kernel, this project's or
Triton's own (`tl.max`, `tl.sum`, `tl.cdiv` are helpers too), patches it all again
(`InterpretedFunction.__call__`): `inspect.getmembers` over the modules and classes, for
every call in every program. Nothing restores between two calls of one launch, so the
second and later patches replace patched attributes with equal ones: wasted work, more than
half the time of this project's interpreted kernel tests
(`test_pipeline_matches_reference_under_churn[triton]`: 31 s, 13 s with this).

After `share_interpreter_patches()`, inside a launch a helper's call patches only the first
time its modules (those Triton picks from its globals: `tl`, or `tl.core` for Triton's own)
are not patched yet in that launch. The launch's own patch and restore, and a helper called
outside any launch, go through Triton's `_patch_lang` as before: the kernels compute the
same values either way.

`scan_in_log_steps`: `tl.associative_scan` with a combine function of the kernel's own (not
a sum or a product, which numpy scans) runs in the interpreter one element at a time, each
step a call of the combine function on scalars: 0.1 s for one [128] scan, about a fifth of
`test_matches_reference_under_churn[triton]` (bad words' segmented minimum, top-p's reverse
running minimum; 26 s in the suite before this, 17 s after). This runs it in
ceil(log2(n)) calls on whole blocks instead (Hillis-Steele: after the step of distance d,
element i combines elements i - 2d + 1 .. i, earlier ones on the left), the combine
function's own code on the same operands in another association: equal for any
associative function whose results are exact (a minimum, a segmented minimum), and as
`tl.associative_scan` requires of its function.

`skip_unasserted_overflow_checks`: Triton's frontend follows every int32 `+`, `-` and `*`
with an overflow check (`sanitize_overflow`, on by default): both operands cast to int64,
the operation again, two comparisons and an `and`, handed to `device_assert`. Under the
interpreter `device_assert` returns at once unless the builder's `debug` option is set,
and the interpreter's never is (`InterpreterOptions.debug` is False, and nothing sets it):
so the interpreter computed every check and threw it away, about a quarter of an
interpreted kernel test's time. This turns the builder's `sanitize_overflow` off while
its `debug` is off: no check that could fail is lost, and no value changes.

`cache_numpy_dtypes`: the interpreter maps a Triton dtype to numpy's with a dict it builds
again on each of its 200,000-odd calls in an interpreted Sampler test (about 8 % of it);
this memoizes the map by the scalar dtype (a block maps as its element type).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

_LANGUAGES: dict[int, frozenset[int]] = {}
"""`_languages` by the id of a function's globals: a module's, which lives as long as the
process does and whose imports are done by the time its kernels run (a scan of every global
on each of a launch's thousands of helper calls took about 3% of an interpreted test)."""


def _languages(fn: Callable[..., Any], tl_modules: tuple[object, ...]) -> frozenset[int]:
    """The ids of the `triton.language` modules `_patch_lang` patches for `fn`: those among
    its globals, as Triton picks them."""
    key = id(fn.__globals__)
    languages = _LANGUAGES.get(key)
    if languages is None:
        languages = frozenset(
            id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in tl_modules
        )
        _LANGUAGES[key] = languages
    return languages


def share_interpreter_patches() -> bool:
    """Make a running launch's patches serve the helpers it calls (see the module
    docstring). Idempotent. False, with nothing changed, where this Triton has no
    interpreter internals of the expected shape (then the interpreter stays as it is)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_lang = getattr(interpreter, "_patch_lang", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if patch_lang is None or scope_type is None or executor is None:
        return False
    if getattr(patch_lang, "shares_patches", False):
        return True
    tl_modules = (tl, tl.core)
    launches = [0]  # GridExecutor calls in progress
    patched: set[int] = set()  # the modules a launch has patched, until it restores them

    def shared_patch_lang(fn: Callable[..., Any]) -> Any:
        if not launches[0]:
            return patch_lang(fn)  # a helper called outside any launch: as Triton does
        languages = _languages(fn, tl_modules)
        if patched:
            # a helper inside the launch: its modules are patched already, or patched now as
            # Triton does (a scope nobody restores: `tl.core` for `tl.max`, say) and then kept
            if languages <= patched:
                return scope_type()
            patched.update(languages)
            return patch_lang(fn)
        scope = patch_lang(fn)  # the launch's own patch
        patched.update(languages)
        restore = scope.restore

        def restore_and_forget() -> None:
            patched.clear()
            restore()

        scope.restore = restore_and_forget
        return scope

    launch = executor.__call__

    def counted_launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        launches[0] += 1
        try:
            return launch(self, *args, **kwargs)
        finally:
            launches[0] -= 1

    shared_patch_lang.shares_patches = True  # type: ignore[attr-defined]
    interpreter._patch_lang = shared_patch_lang
    executor.__call__ = counted_launch
    return True


def scan_in_log_steps() -> bool:
    """Make the interpreter's scans with a kernel's own combine function take log-depth
    whole-block steps (see the module docstring). Idempotent. False, with nothing changed,
    where this Triton's interpreter has no `ScanOps.generic_scan`."""
    try:
        import numpy as np
        from triton.runtime import interpreter
    except ImportError:
        return False
    scan_ops = getattr(interpreter, "ScanOps", None)
    if scan_ops is None or not hasattr(scan_ops, "generic_scan"):
        return False
    if getattr(scan_ops.generic_scan, "in_log_steps", False):
        return True

    def generic_scan(self: Any, inputs: list[Any]) -> list[Any]:
        axis = self.axis
        dtypes = [arg.dtype for arg in inputs]
        # the scanned axis last; every step combines whole blocks of the operands' shape
        done = [np.moveaxis(arg.handle.data, axis, -1).copy() for arg in inputs]
        size = done[0].shape[-1]
        distance = 1
        while distance < size:
            # element i with element i - distance on its left; the first `distance`
            # elements (combined with wrapped-around ones) keep their values
            left = [
                self.to_tensor(np.roll(d, distance, -1), t)
                for d, t in zip(done, dtypes, strict=True)
            ]
            right = [self.to_tensor(d, t) for d, t in zip(done, dtypes, strict=True)]
            out = self.combine_fn.fn(*left, *right)
            out = out if isinstance(out, tuple) else (out,)
            for d, o in zip(done, out, strict=True):
                value = o.handle.data if hasattr(o, "handle") else o
                d[..., distance:] = np.broadcast_to(value, d.shape)[..., distance:]
            distance *= 2
        return [
            self.to_tensor(np.moveaxis(d, -1, axis), t) for d, t in zip(done, dtypes, strict=True)
        ]

    generic_scan.in_log_steps = True  # type: ignore[attr-defined]
    generic_scan.element_by_element = scan_ops.generic_scan  # type: ignore[attr-defined]
    scan_ops.generic_scan = generic_scan
    return True


def skip_unasserted_overflow_checks() -> bool:
    """Turn off the interpreter's integer overflow checks, whose `device_assert` it never
    evaluates (see the module docstring). False, with nothing changed, where this Triton's
    interpreter has no builder options of the expected shape or runs with `debug` on (then
    its checks assert, and stay)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder: Any = getattr(interpreter, "interpreter_builder", None)
    options: Any = getattr(builder, "options", None)
    fields = getattr(options, "__dataclass_fields__", {})  # a frozen dataclass: replaced
    if "sanitize_overflow" not in fields or "debug" not in fields:
        return False
    if options.debug:
        return False
    if options.sanitize_overflow:
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


def cache_numpy_dtypes() -> bool:
    """Memoize the interpreter's Triton-to-numpy dtype map (see the module docstring).
    Idempotent. False, with nothing changed, where this Triton's interpreter has no
    `_get_np_dtype`."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    np_dtype = getattr(interpreter, "_get_np_dtype", None)
    if np_dtype is None:
        return False
    if getattr(np_dtype, "cached", False):
        return True
    cache: dict[Any, Any] = {}

    def cached_np_dtype(tt_dtype: Any) -> Any:
        # a block maps as its element type does, and every pointer type as one (uint64):
        # the map's own rules; a scalar by its name (how dtypes compare)
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        key = None if isinstance(scalar, tl.pointer_type) else scalar.name
        found = cache.get(key)
        if found is None:
            found = cache[key] = np_dtype(scalar)
        return found

    cached_np_dtype.cached = True  # type: ignore[attr-defined]
    cached_np_dtype.uncached = np_dtype  # type: ignore[attr-defined]
    interpreter._get_np_dtype = cached_np_dtype
    return True


def speed_up_interpreter() -> bool:
    """Install the four speed-ups of this module; whether every one applies to this Triton
    (each that does not leaves the interpreter as it is)."""
    installed = (
        share_interpreter_patches(),
        scan_in_log_steps(),
        skip_unasserted_overflow_checks(),
        cache_numpy_dtypes(),
    )
    return all(installed)
