"""The search: a sensitivity pass, then whole-model assignments measured end to end.

1. fp32 baseline; then every group alone in every scheme (the sensitivity pass). The
   baseline's tokens/s is measured again after the sensitivity pass, after the anchors and at
   the end; the best of them is its speed (a busy moment at the start skews no speedup).
2. The additive model: predicted quality = fp32 + the sum of the groups' deltas (KL alike).
3. Anchors: every scheme for the whole model. Seed: the best point, by the goal, on the
   additive greedy path (fp32 -> cheapest, always the move losing the least predicted
   quality, then KL, per byte saved).
4. Local search with a two-sided beam: neighbours (one group to another scheme, or one group
   one level up and another one level down) of the `beam` best feasible measured points and
   the `beam` infeasible ones closest to the goal (approaching its boundary from both sides:
   an aggressive point whose errors partly cancel is one repair away) are predicted from their
   parent's *measured* quality plus the additive deltas of what changed; of the neighbours
   that would beat the incumbent were their change harmless, the best predicted is measured
   next (early-stopped when it cannot matter), until none is left or the budget is spent.
   Measured points carry the interactions the additive model lacks, so the beam starts from
   them (docs/quant-search.md says why this and not a plain additive optimum).

The evaluator (graft.quantize.evaluator.Evaluator, or any object with the same attributes)
measures; this module only decides what to measure.
"""

from __future__ import annotations

from graft.quantize.groups import assignment_key
from graft.quantize.pareto import Goal, dominates


SPEED_TAGS = ("start", "after sensitivity", "after anchors", "end")  # baseline speed samples


class Search:
    def __init__(self, ev, goal: Goal, state, max_evals: int = 16, beam: int = 3, progress=None):
        self.ev, self.goal, self.state = ev, goal, state
        self.max_evals, self.beam = max_evals, beam
        self.progress = progress  # callable(point) after each point (new or resumed)
        self.groups, self.schemes = list(ev.groups), list(ev.schemes)  # schemes: precise -> cheap
        self.base: dict | None = None
        self.delta_q: dict = {}  # group -> scheme -> quality change alone
        self.kl: dict = {}  # group -> scheme -> KL alone
        self.additive_ready = False  # the sensitivity pass is complete
        # points reached by this run, in order: decisions look only at these, so a resumed
        # run (whose state already holds later points) replays the same decisions
        self.seen: dict[str, dict] = {}

    # --- measuring ------------------------------------------------------------------
    def evaluate(self, assignment: dict, phase: str, early_stop: bool = False) -> dict:
        key = assignment_key(assignment, self.groups)
        point = self.state.get(key)
        if point is None:
            stop = self._stop_rule() if early_stop else None
            point = {"key": key, "phase": phase, "assignment": dict(assignment),
                     **self.ev.measure(assignment, stop)}
            point.update(self._predictions(assignment))
            self.state.add(point)
        self.seen[key] = point
        if self.progress is not None:
            self.progress(point)
        return point

    def refresh_base_speed(self, tag: str) -> None:
        """Measure the fp32 baseline's decode tokens/s again and keep the best of its
        measurements as its speed: one baseline taken while the machine was busy would inflate
        every speedup (and the speedup goal). The best run is the least disturbed one, as in
        each point's own measurement. The samples live in the baseline's state entry, so a
        resumed run replays the same numbers."""
        samples = self.base.setdefault("tokens_per_s_samples", {"start": self.base["tokens_per_s"]})
        if tag not in samples:
            samples[tag] = self.ev.tokens_per_s({g: "fp32" for g in self.groups})
            self.state.save()
        # only the samples up to this one: a resumed run decides with what the first run knew
        upto = SPEED_TAGS[:SPEED_TAGS.index(tag) + 1]
        self.base["tokens_per_s"] = max(samples[t] for t in upto if t in samples)

    def _stop_rule(self):
        """Stop a candidate whose best case (quality upper bound) is dominated by a measured
        point, or (goal drop) cannot meet the quality floor."""
        done = [p for p in self.seen.values() if p.get("complete")]

        def stop(upper_bound: float, tokens_per_s: float, weight_bytes: int) -> bool:
            best = {"quality": upper_bound, "tokens_per_s": tokens_per_s, "weight_bytes": weight_bytes}
            if self.goal.kind == "drop" and self.goal.violation(best, self.base) > 0:
                return True
            return any(dominates(p, best) for p in done)
        return stop

    # --- the additive model ---------------------------------------------------------
    def _predictions(self, assignment: dict) -> dict:
        if not self.additive_ready:
            return {"predicted_quality": None, "predicted_kl": None}
        q = self.base["quality"] + sum(self.delta_q[g][assignment[g]] for g in self.groups)
        kl = sum(self.kl[g][assignment[g]] for g in self.groups)
        return {"predicted_quality": q, "predicted_kl": kl}

    def predict(self, child: dict, parent: dict) -> dict:
        """The child's point as the parent's measurement plus the additive deltas of what
        changed; tokens/s scaled by bytes (batch-1 decode reads every weight once per token)."""
        dq = sum(self.delta_q[g][child[g]] - self.delta_q[g][parent["assignment"][g]]
                 for g in self.groups)
        dkl = sum(self.kl[g][child[g]] - self.kl[g][parent["assignment"][g]] for g in self.groups)
        nbytes = self.ev.weight_bytes(child)
        return {"quality": parent["quality"] + dq, "kl": (parent.get("kl") or 0.0) + dkl,
                "weight_bytes": nbytes,
                "tokens_per_s": parent["tokens_per_s"] * parent["weight_bytes"] / nbytes}

    def additive_path(self) -> list[dict]:
        """fp32 -> every group in the cheapest scheme, one move at a time, each move the one
        that loses the least predicted quality (then KL) per byte saved."""
        current = {g: "fp32" for g in self.groups}
        path = [dict(current)]
        while True:
            moves = [(g, s) for g in self.groups
                     for s in self.schemes[self.schemes.index(current[g]) + 1:]]
            if not moves:
                return path

            def cost(move):
                g, s = move
                saved = max(self.ev.group_bytes(g, current[g]) - self.ev.group_bytes(g, s), 1)
                loss = self.delta_q[g][current[g]] - self.delta_q[g][s]
                return (max(loss, 0.0) / saved, (self.kl[g][s] - self.kl[g][current[g]]) / saved)
            g, s = min(moves, key=cost)
            current[g] = s
            path.append(dict(current))

    # --- the phases -----------------------------------------------------------------
    def run(self) -> list[dict]:
        fp32 = {g: "fp32" for g in self.groups}
        self.base = self.evaluate(fp32, "baseline")
        self.refresh_base_speed("start")  # a resumed baseline holds later samples too
        for g in self.groups:
            self.delta_q[g], self.kl[g] = {"fp32": 0.0}, {"fp32": 0.0}
            for s in self.schemes[1:]:
                p = self.evaluate({**fp32, g: s}, "sensitivity")
                self.delta_q[g][s] = p["quality"] - self.base["quality"]
                self.kl[g][s] = p["kl"] or 0.0
        self.additive_ready = True
        self.refresh_base_speed("after sensitivity")
        for point in self.seen.values():  # the first ones predate the deltas
            point.update(self._predictions(point["assignment"]))
        for s in self.schemes[1:]:
            self.evaluate({g: s for g in self.groups}, "anchor")
        self.refresh_base_speed("after anchors")
        seed = min(self.additive_path(),
                   key=lambda a: self.goal.rank(self.predict(a, self.base), self.base))
        self.evaluate(seed, "seed")
        for _ in range(self.max_evals):
            child = self._next_candidate()
            if child is None:
                break
            self.evaluate(child, "search", early_stop=True)
        self.refresh_base_speed("end")
        self.state.save()
        return list(self.seen.values())

    def _next_candidate(self) -> dict | None:
        done = sorted((p for p in self.seen.values() if p.get("complete")),
                      key=lambda p: self.goal.rank(p, self.base))
        incumbent = self.goal.rank(done[0], self.base)
        # two-sided beam: from the best feasible points down and the closest infeasible ones up
        feasible = [p for p in done if self.goal.violation(p, self.base) == 0]
        # (only those that would beat the incumbent, were they repaired: the rest lead nowhere)
        infeasible = [p for p in done if self.goal.violation(p, self.base) > 0
                      and self.goal.rank(self.goal.repaired(p, self.base), self.base) < incumbent]
        best, best_key = None, None
        for parent in feasible[:self.beam] + infeasible[:self.beam]:
            for child in self._neighbours(parent["assignment"]):
                if assignment_key(child, self.groups) in self.seen:
                    continue
                pred = self.predict(child, parent)
                # worth measuring if it would beat the incumbent were the change harmless
                # (interactions can make it so); the likeliest by prediction goes first
                hopeful = {**pred, "quality": max(pred["quality"], parent["quality"])}
                if self.goal.rank(hopeful, self.base) >= incumbent:
                    continue
                rank = (self.goal.rank(pred, self.base), pred["kl"])
                if best_key is None or rank < best_key:
                    best, best_key = child, rank
        return best

    def _neighbours(self, assignment: dict):
        levels = self.schemes
        for g in self.groups:
            for s in levels:
                if s != assignment[g]:
                    yield {**assignment, g: s}
        for g in self.groups:  # swaps: precision moves from one group to another
            i = levels.index(assignment[g])
            if i == 0:
                continue
            for h in self.groups:
                j = levels.index(assignment[h])
                if h != g and j + 1 < len(levels):
                    yield {**assignment, g: levels[i - 1], h: levels[j + 1]}
