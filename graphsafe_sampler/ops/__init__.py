"""Graph-safe tensor operations of the PyTorch backend (the reference the Triton kernels match)."""
