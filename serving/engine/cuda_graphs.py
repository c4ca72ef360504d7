"""CUDA graphs of the decode-only forward, one per padded batch size.

A decode step of a small model on a GPU is bound by Python and kernel launches, not by the GPU
(SmolLM2-135M at batch 32 on an H200: ~25 ms a step eager, for ~1 ms of GPU work). Replaying
a captured graph launches the whole forward at once. The graphs read their inputs from static
buffers; a batch of n sequences runs the smallest captured size >= n, with the spare rows made
harmless: KV slot -1 (store_kv skips it) and context length 0 (attention writes zeros).
"""

from __future__ import annotations

import bisect

import torch

from graft.serving.models.layers import AttentionMetadata


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, then every multiple of 8 up to max_num_seqs (and max_num_seqs itself)."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs]
    sizes += list(range(8, max_num_seqs, 8))
    return sorted(set(sizes + [max_num_seqs]))


class DecodeGraphs:
    def __init__(self, runner, sizes: list[int], capture: bool = True):
        """capture=False runs the same static-buffer forward without graphs (any device): the
        padding and buffer logic can then be tested on a CPU."""
        self.runner = runner
        self.sizes = sorted(sizes)
        dev, top = runner.device, self.sizes[-1]
        width = -(-runner.max_model_len // runner.block_size)  # every context fits this table
        self.input_ids = torch.zeros(top, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(top, dtype=torch.int64, device=dev)
        self.slots = torch.full((top,), -1, dtype=torch.int64, device=dev)
        self.context_lens = torch.zeros(top, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(top, width, dtype=torch.int32, device=dev)
        self.rows = torch.arange(top, dtype=torch.int64, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.replays = 0
        if capture:
            with torch.inference_mode():  # as execute(): else dispatch picks the autograd path
                self._capture(dev)

    def _capture(self, dev) -> None:
        pool = None
        for size in reversed(self.sizes):  # largest first: the smaller ones reuse its memory pool
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):  # warm-up: Triton compiles, allocator settles
                self._forward(size)
            torch.cuda.current_stream(dev).wait_stream(side)
            with torch.cuda.graph(graph, pool=pool):
                self.logits[size] = self._forward(size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize(dev)

    def _forward(self, size: int) -> torch.Tensor:
        r = self.runner
        meta = AttentionMetadata(
            slot_mapping=self.slots[:size], num_decodes=size,
            decode_block_tables=self.block_tables[:size], decode_context_lens=self.context_lens[:size],
            prefill_block_tables=None, prefill_cu_seqlens=None, prefill_context_lens=None)
        pos = self.positions[:size]
        return r.model(self.input_ids[:size], r.cos_table[pos], r.sin_table[pos], meta,
                       self.rows[:size], None)

    def fits(self, num_seqs: int) -> bool:
        return num_seqs <= self.sizes[-1]

    def run(self, ids: list[int], positions: list[int], slots: list[int], tables: list[list[int]],
            context_lens: list[int]) -> torch.Tensor:
        """Logits [n, vocab] of n decoding sequences (n <= the largest captured size)."""
        n = len(ids)
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        pad = size - n
        # one host tensor, one copy: ids | positions | slots | context lengths
        host = torch.tensor([ids + [0] * pad, positions + [0] * pad, slots + [-1] * pad,
                             context_lens + [0] * pad], dtype=torch.int64)
        dev = self.input_ids.device
        host = host.to(dev, non_blocking=True)
        self.input_ids[:size].copy_(host[0])
        self.positions[:size].copy_(host[1])
        self.slots[:size].copy_(host[2])
        self.context_lens[:size].copy_(host[3])
        width = max(len(t) for t in tables)
        table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        # columns past `width` keep stale ids: the kernel reads only blocks below each context
        self.block_tables[:n, :width].copy_(table.to(dev, non_blocking=True))
        self.replays += 1
        if not self.graphs:
            return self._forward(size)[:n]
        self.graphs[size].replay()
        return self.logits[size][:n]
