"""Benchmark support shipped with the package, so that `graphsafe-sampler bench` works from an
installed wheel: LLM-like logits, the vLLM-V1-style eager peer, a churning persistent-batch
workload, timing, providers, and the JSON results format with its compare gate.

The pytest-benchmark suite in `perf/` imports from here; nothing here imports pytest.
"""
