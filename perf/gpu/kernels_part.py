"""The kernels part: every kernel variant the package launches (tests/cuda_compile.py's
list, the one that CI compiles for sm_90 without a GPU), compiled and run once on CUDA at a
tiny shape, so that a compile or launch failure shows first, alone, with its variant."""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from . import ROOT
from .device import cuda_alive, observed_launches
from .options import Options
from .report import error_text, write_json

KERNELS_JSON = "kernels.json"


def _cuda_compile() -> Any:
    """tests/cuda_compile.py, imported from the checkout (tests/ is not a package)."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import cuda_compile

    return cuda_compile


def run_kernels_part(opts: Options, deadline: float) -> dict[str, Any]:
    """Each (label, launch) of `cuda_compile._launches()` on the device with zero-filled
    tensors: the first call of a variant compiles it. Failed when a variant raised or a
    kernel of kernels/ was never launched; incomplete when the time ran out."""
    device = opts.device()
    cuda_compile = _cuda_compile()
    cuda_compile.DEVICE = device
    launched: set[str] = set()
    results: list[dict[str, Any]] = []
    cut = False
    with observed_launches() as launches:
        for label, call in cuda_compile._launches():
            if time.monotonic() > deadline:
                cut = True
                break
            start = time.monotonic()
            try:
                call()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                results.append({"label": label, "ok": True})
            except Exception as exc:
                results.append({"label": label, "ok": False, "error": error_text(exc, 1500)})
                if not cuda_alive(device):
                    break
            finally:
                # the names only: no variant's tensors are kept past its call
                launched.update(kernel.__name__ for kernel, *_ in launches)
                launches.clear()
            results[-1]["seconds"] = round(time.monotonic() - start, 2)
    missing = sorted(cuda_compile.kernels_in_package() - launched) if not cut else []
    failed = [r["label"] for r in results if not r["ok"]]
    doc = {"variants": results, "missing_kernels": missing, "failed": failed}
    write_json(opts.out / KERNELS_JSON, doc)
    status = "failed" if failed or missing else "incomplete" if cut else "passed"
    return {"status": status, "variants": len(results), "failed": failed,
            "missing_kernels": missing, "outputs": [KERNELS_JSON]}  # fmt: skip
