"""The C int8 KV store writes exactly the reference's quantized rows and scales."""

import pytest
import torch

from graft.kernels import cpu_ops, reference

pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason="the C kernels could not be built")


@pytest.mark.parametrize("d", [16, 64, 72])
def test_c_int8_store_equals_the_reference(d):
    torch.manual_seed(d)
    nb, bs, heads, rows = 10, 4, 3, 30
    k = torch.randn(rows, heads, d) * torch.logspace(-4, 3, rows)[:, None, None]
    k[3] = 0.0  # an all-zero head vector: scale 0, no division by zero
    k[5, 1, 0] = 127.5 * float(k[5, 1].abs().max()) / 127  # exact halves round to even
    v = torch.randn(rows, heads, d)
    slots = torch.randperm(nb * bs)[:rows]
    slots[4] = -1  # a padding row
    want = [torch.zeros(nb, bs, heads, d, dtype=torch.int8) for _ in range(2)]
    want += [torch.zeros(nb, bs, heads) for _ in range(2)]
    got = [t.clone() for t in want]
    reference.store_kv(k, v, *want[:2], slots, *want[2:])
    cpu_ops.store_kv(k, v, *got[:2], slots, *got[2:])
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    assert got[2].view(-1, heads)[slots[3]].abs().max() == 0


def test_slot_past_the_end_is_refused():
    cache = [torch.zeros(2, 2, 1, 4, dtype=torch.int8) for _ in range(2)]
    scales = [torch.zeros(2, 2, 1) for _ in range(2)]
    with pytest.raises(ValueError, match="slot 9"):
        cpu_ops.store_kv(torch.ones(1, 1, 4), torch.ones(1, 1, 4), *cache, torch.tensor([9]),
                         *scales)
