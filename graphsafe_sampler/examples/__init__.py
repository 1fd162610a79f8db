"""Worked examples: a graph-safe custom processor (target_token.py), a tiny decoder with a
graph-safe decode step for the demo (tiny_decoder.py), and a tensor-parallel decode loop
over its vocabulary-split LM head (tensor_parallel.py)."""
