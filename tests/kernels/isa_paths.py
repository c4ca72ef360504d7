"""Run one C linear call on this machine's path and on a smaller CPU's (cpu_quant.isa_capped),
for tests that compare two paths."""

import torch

from graft.kernels import cpu_quant


def this_and_capped(x, qw, bias, cap: str, threads: int | None = None):
    """(cpu_quant.quant_linear on this machine's path, the same call capped at `cap`), on
    `threads` torch threads (default: as set)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        got = cpu_quant.quant_linear(x, qw, bias)
        with cpu_quant.isa_capped(cap):
            return got, cpu_quant.quant_linear(x, qw, bias)
    finally:
        torch.set_num_threads(before)
