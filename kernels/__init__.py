"""Triton kernels, each with a pure-PyTorch reference of the same signature."""
