"""The search logic against a synthetic evaluator with planted effects (no model): it finds an
optimum the additive prediction rules out, stops dominated candidates, and resumes."""

import pytest

from graft.errors import GraftConfigError
from graft.quantize.pareto import Goal, choose, interaction_summary, pareto_front
from graft.quantize.search import Search
from graft.quantize.state import SearchState

BYTES = {"fp32": 100, "int8": 25, "int4-g32": 13}


class Planted:
    """Groups a..d. Alone, int4 costs a and b 0.1 each, but together their errors cancel;
    c loses 0.2 in int4 (int8 is harmless); d is harmless everywhere."""

    groups = ["a", "b", "c", "d"]
    schemes = ["fp32", "int8", "int4-g32"]

    def __init__(self, fail_after=None, base_speeds=None):
        self.calls, self.fail_after = 0, fail_after
        self.base_speeds = list(base_speeds or [])  # fp32 re-measurements, in order
        self.speed_calls = 0

    def tokens_per_s(self, assignment):
        self.speed_calls += 1
        return self.base_speeds.pop(0) if self.base_speeds else 1e4 / self.weight_bytes(assignment)

    def group_bytes(self, g, s):
        return BYTES[s]

    def weight_bytes(self, assignment):
        return sum(BYTES[assignment[g]] for g in self.groups)

    def quality(self, a):
        four = {g for g in self.groups if a[g] == "int4-g32"}
        q = 1.0 - 0.2 * ("c" in four)
        if len(four & {"a", "b"}) == 1:
            q -= 0.1
        return q

    def measure(self, assignment, stop=None):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt
        q, nbytes = self.quality(assignment), self.weight_bytes(assignment)
        tps = 1e4 / nbytes
        if stop is not None and stop(q, tps, nbytes):  # as if the last chunk were left
            return {"quality": None, "complete": False, "upper_bound": q, "tokens_per_s": tps,
                    "weight_bytes": nbytes, "kl": None, "tasks": {}, "answers": {}}
        return {"quality": q, "complete": True, "upper_bound": q, "tokens_per_s": tps,
                "weight_bytes": nbytes, "kl": 0.01 * (1.0 - q), "tasks": {"t": q}, "answers": {}}


def _search(tmp_path, ev, goal=Goal("drop", 0.02), max_evals=12):
    state = SearchState(tmp_path, {"test": 1})
    search = Search(ev, goal, state, max_evals=max_evals, beam=2)
    return search, search.run()


def test_finds_the_planted_optimum_the_additive_model_rules_out(tmp_path):
    search, points = _search(tmp_path, Planted())
    best = choose(points, search.goal, search.base)
    assert best["assignment"] == {"a": "int4-g32", "b": "int4-g32", "c": "int8", "d": "int4-g32"}
    assert best["quality"] == 1.0 and best["predicted_quality"] == pytest.approx(0.8)
    seed = next(p for p in points if p["phase"] == "seed")  # additive: a, b stay at int8
    assert seed["assignment"]["a"] == seed["assignment"]["b"] == "int8"
    gaps = interaction_summary(points)
    assert gaps["cancel"] >= 1 and gaps["max_gap"] == pytest.approx(0.2)


class Additive(Planted):
    """The same without the cancellation: every int4 of a, b costs 0.1."""

    def quality(self, a):
        four = {g for g in self.groups if a[g] == "int4-g32"}
        return 1.0 - 0.2 * ("c" in four) - 0.1 * len(four & {"a", "b"})


def test_dominated_candidates_stop_early_and_stay_off_the_front(tmp_path):
    search, points = _search(tmp_path, Additive())
    assert choose(points, search.goal, search.base)["key"] == "a=int8,b=int8,c=int8,d=int4-g32"
    stopped = [p for p in points if not p["complete"]]
    assert stopped and all(p["phase"] == "search" for p in stopped)
    assert all(p["complete"] for p in pareto_front(points))


def test_interrupted_search_resumes_from_its_state_file(tmp_path):
    ev_full = Planted()
    _, full = _search(tmp_path / "full", ev_full)
    with pytest.raises(KeyboardInterrupt):
        _search(tmp_path / "cut", Planted(fail_after=9))
    ev_rest = Planted()
    _, resumed = _search(tmp_path / "cut", ev_rest)
    assert [p["key"] for p in resumed] == [p["key"] for p in full]
    assert ev_rest.calls == ev_full.calls - 9


def test_state_of_other_settings_is_refused(tmp_path):
    SearchState(tmp_path, {"tasks": ["a"]}).save()
    with pytest.raises(GraftConfigError, match=r"other settings \(tasks differ\); use another --out"):
        SearchState(tmp_path, {"tasks": ["b"]})


def test_unreachable_goal_names_the_closest_point(tmp_path):
    search, points = _search(tmp_path, Planted(), goal=Goal("speedup", 100.0), max_evals=2)
    with pytest.raises(GraftConfigError, match=r"no evaluated configuration meets the goal .* "
                                               r"the closest: a=int4-g32,b=int4-g32,c=int4-g32"):
        choose(points, search.goal, search.base)


def _p(q, tps, nbytes, complete=True):
    return {"key": f"{q}/{tps}/{nbytes}", "quality": q, "tokens_per_s": tps,
            "weight_bytes": nbytes, "complete": complete}


def test_pareto_filter():
    a, b, c = _p(0.9, 10, 100), _p(0.8, 20, 50), _p(0.7, 15, 60)  # c: dominated by b
    d, e = _p(0.9, 10, 100), _p(0.95, 5, 200)  # d ties a (both stay); e: best quality
    f = _p(1.0, 30, 10, complete=False)  # stopped early: never on the front
    front = pareto_front([a, b, c, d, e, f])
    assert front == [b, a, d, e]


def test_a_disturbed_baseline_speed_is_measured_again_and_the_best_kept(tmp_path):
    """The fp32 speed taken at the start (here 10x too slow, as on a busy machine) would make
    every point look 10x faster; the re-measurements replace it, and a resumed run replays
    them without measuring again."""

    class SlowStart(Planted):
        def measure(self, assignment, stop=None):
            out = super().measure(assignment, stop)
            if all(s == "fp32" for s in assignment.values()):
                out["tokens_per_s"] /= 10
            return out

    ev = SlowStart(base_speeds=[20.0, 26.0, 31.0])
    search, points = _search(tmp_path, ev, goal=Goal("speedup", 3.0))
    assert ev.speed_calls == 3
    base = search.base
    assert base["tokens_per_s_samples"] == {"start": 2.5, "after sensitivity": 20.0,
                                            "after anchors": 26.0, "end": 31.0}
    assert base["tokens_per_s"] == 31.0
    again = SlowStart()
    resumed, replayed = _search(tmp_path, again, goal=Goal("speedup", 3.0))
    assert again.speed_calls == 0 and again.calls == 0 and resumed.base["tokens_per_s"] == 31.0
    assert [p["key"] for p in replayed] == [p["key"] for p in points]  # the same decisions
