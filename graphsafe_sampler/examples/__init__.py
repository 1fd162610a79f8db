"""Worked examples of custom processors written with the public helpers."""
