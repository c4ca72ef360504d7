"""`python -m graft.benchmarks.trace_cost` measures both threads' share of a trace line."""

from graft.benchmarks.trace_cost import measure


def test_trace_cost_measures_both_threads(tmp_path):
    for with_image in (False, True):
        r = measure(with_image, 3)
        assert r["image"] is with_image and r["enqueue_us"] >= 0 and r["line_us"] > 0
