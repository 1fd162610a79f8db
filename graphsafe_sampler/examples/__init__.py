"""Worked examples: a graph-safe custom processor (target_token.py), a tiny decoder with a
graph-safe decode step for the demo (tiny_decoder.py), a tensor-parallel decode loop over
its vocabulary-split LM head (tensor_parallel.py), and structured output with xgrammar's
JSON-schema masks end to end (structured_output.py)."""
