"""Constants the kernels share with the PyTorch stages, kept here so that kernels/ imports
nothing from the package above it (the stages import them from here)."""

GREEDY_TEMPERATURE = 1e-5
"""Rows whose temperature is below this are greedy (vLLM's _SAMPLING_EPS)."""

SATURATED = 255
"""A penalty count byte at 255: the token was output 255 times or more, and the excess sits
in the slot's overflow table."""

SALT_SAMPLE = 0
"""Random stream: sampling the next token, the race over the vocabulary."""
SALT_ACCEPT = 1
"""Random stream (speculative decoding): the uniform that accepts or rejects a draft."""
SALT_RECOVER = 2
"""Random stream (speculative decoding): the recovered token after a rejected draft."""
SALT_BONUS = 3
"""Random stream (speculative decoding): the bonus token after every draft was accepted."""
