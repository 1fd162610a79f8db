"""Worked examples: a graph-safe custom processor (target_token.py) and a tiny decoder
with a graph-safe decode step for the demo (tiny_decoder.py)."""
