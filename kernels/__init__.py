"""Triton kernels, installed as `graphsafe_sampler.kernels` (one concern per file)."""
