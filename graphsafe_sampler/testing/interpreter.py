"""`share_interpreter_patches`: the Triton interpreter without its per-call re-patching.

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
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def _languages(fn: Callable[..., Any], tl_modules: tuple[object, ...]) -> set[int]:
    """The ids of the `triton.language` modules `_patch_lang` patches for `fn`: those among
    its globals, as Triton picks them."""
    return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in tl_modules}


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
