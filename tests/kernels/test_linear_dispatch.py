"""The prefill linear dispatch (graft.kernels.linear_dispatch): the choice from a timing
table, the timings file's round trip, timing under an injected clock, and the torch path's
result. No test reads the machine's speed."""

import json

import pytest
import torch

from graft.errors import GraftConfigError
from graft.kernels import cpu_ops, cpu_quant
from graft.kernels import linear_dispatch as ld
from graft.kernels.quant_formats import QuantScheme, quant_linear, quantize
from graft.serving.engine.config import LINEAR_DISPATCH_MODES, EngineConfig


def test_rows_go_to_the_nearest_bucket():
    assert [ld.bucket(r) for r in (0, 1, 2, 3, 8, 16, 17, 60, 64, 100, 300, 4096)] == \
        [1, 1, 1, 8, 8, 8, 32, 32, 32, 128, 512, 512]  # a tie: the smaller


def test_choice_needs_torch_clearly_faster():
    table = {"int8:64x128:r512": {"c": 1.0, "torch": 0.5},
             "int8:64x128:r8": {"c": 1.0, "torch": 2.0},
             "fp32:64x128:r128": {"c": 1.0, "torch": 0.97},  # inside the margin: C keeps it
             "fp32:64x128:r32": {"c": 1.0}}  # a path never timed: C
    assert ld.choose(table) == {"int8:64x128:r512": "torch", "int8:64x128:r8": "c",
                                "fp32:64x128:r128": "c", "fp32:64x128:r32": "c"}


def test_timings_file_round_trip(tmp_path):
    where = {"cpu": "Test CPU", "cpu_flags": "abc", "torch": "9.9", "threads": 3, "c_library": "x.so"}
    path = ld.cache_file(tmp_path, where)
    assert path.parent == tmp_path and path.name.startswith("linear-dispatch-")
    assert path != ld.cache_file(tmp_path, {**where, "threads": 4})  # another thread count: anew
    assert ld.load_timings(path) == {}
    table = {"int4-g32:64x128:r512": {"c": 0.002, "torch": 0.001}}
    ld.save_timings(path, table, where)
    assert ld.load_timings(path) == table
    assert json.loads(path.read_text())["machine"] == where
    path.write_text(json.dumps({"version": ld.FILE_VERSION + 1, "timings": table}))
    assert ld.load_timings(path) == {}
    path.write_text("{not json")
    assert ld.load_timings(path) == {}


class FakeClock:
    """Seconds advance only by what the fake paths say each call costs."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def path(self, seconds):
        def run():
            self.now += seconds
        return run


def test_measure_times_the_largest_rows_first_within_the_budget():
    clock = FakeClock()
    cases = [ld.Case("int8", 64, 128, rows) for rows in ld.ROW_BUCKETS]

    def runners(case):  # C costs 1 ms a row, torch a fixed 200 ms
        return {"c": clock.path(1e-3 * case.rows), "torch": clock.path(0.2)}

    timings = ld.measure(cases, runners, budget_s=None, clock=clock)
    assert timings["int8:64x128:r512"] == pytest.approx({"c": 0.512, "torch": 0.2})
    assert ld.choose(timings) == {"int8:64x128:r1": "c", "int8:64x128:r8": "c",
                                  "int8:64x128:r32": "c", "int8:64x128:r128": "c",
                                  "int8:64x128:r512": "torch"}
    clock.now = 0.0
    partial = ld.measure(cases, runners, budget_s=1.0, clock=clock)
    assert list(partial) == ["int8:64x128:r512"]  # 1.4 s spent on it: the rest waits


def test_mode_comes_from_the_option_then_the_environment(monkeypatch):
    assert LINEAR_DISPATCH_MODES == ld.MODES
    monkeypatch.delenv(ld.ENV, raising=False)
    assert ld.resolve_mode(None) == "cached"
    monkeypatch.setenv(ld.ENV, "torch")
    assert ld.resolve_mode(None) == "torch" and ld.resolve_mode("measure") == "measure"
    monkeypatch.setenv(ld.ENV, "fast")
    with pytest.raises(GraftConfigError, match=ld.ENV):
        ld.resolve_mode(None)
    with pytest.raises(GraftConfigError, match="EngineConfig.linear_dispatch"):
        EngineConfig(linear_dispatch="fast")


@pytest.mark.skipif(not cpu_ops.available(), reason="C kernels unavailable")
@pytest.mark.parametrize("scheme", ["fp32", "bf16", "int8", "int4-g32"])
def test_torch_path_is_the_reference_and_keeps_one_copy(scheme):
    g = torch.Generator().manual_seed(0)
    w, x, b = torch.randn(96, 64, generator=g), torch.randn(40, 64, generator=g), torch.randn(96, generator=g)
    qw = quantize(w, QuantScheme.parse(scheme))
    want = quant_linear(x, qw, b)
    cpu_quant.pack_only(qw)  # as the engine holds it: the C layout only
    got = ld.torch_linear(x, qw, b)
    assert qw.tensors() == []  # rebuilt for the call, not kept
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the C kernels sum in their own order (AVX-512's int4 path differs by ~1e-5 here)
    torch.testing.assert_close(cpu_quant.quant_linear(x, qw, b), got, rtol=1e-5, atol=1e-4)
