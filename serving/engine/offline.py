"""The engine's offline calls: `generate` (prompts to completions) and `embed` (prompts to
embeddings, pooling.py), each run to the end in one continuous batch on add_request and step."""

from __future__ import annotations

import itertools

from graft.serving.engine.mm_inputs import MultiModalInputs
from graft.serving.engine.outputs import RequestOutput
from graft.serving.engine.pooling import PoolingParams
from graft.serving.engine.sampling_params import SamplingParams


class OfflineRuns:
    """Mixed into Engine (engine.py): what it adds needs add_request, abort and step."""

    _gen_ids = itertools.count()

    def generate(self, prompts: list[str] | str | None = None,
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 prompt_token_ids: list[list[int]] | None = None,
                 mm_inputs: list[MultiModalInputs | None] | None = None,
                 request_ids: list[str] | None = None,
                 grafts: list[str | None] | None = None) -> list[RequestOutput]:
        """Run prompts (strings or token id lists, with their images' `mm_inputs` where they
        have any) to completion in one continuous batch; outputs in input order. The one
        offline loop: generate_chats, the eval engine backend and graft chat run on it.
        request_ids name the requests (default `generate-N`); grafts, the graft each asked
        for (per-graft state such as the suffix-decoding table)."""
        return self._run(prompts, sampling_params or SamplingParams(), prompt_token_ids,
                         mm_inputs, request_ids, grafts, "sampling_params")

    def embed(self, prompts: list[str] | str | None = None,
              pooling_params: PoolingParams | list[PoolingParams] | None = None,
              prompt_token_ids: list[list[int]] | None = None,
              mm_inputs: list[MultiModalInputs | None] | None = None,
              request_ids: list[str] | None = None) -> list[RequestOutput]:
        """The embedding of each prompt (`RequestOutput.embedding`), as generate runs them:
        last-token pooling, normalized, unless pooling_params say otherwise."""
        return self._run(prompts, pooling_params or PoolingParams(), prompt_token_ids,
                         mm_inputs, request_ids, None, "pooling_params")

    def _run(self, prompts, params, prompt_token_ids, mm_inputs, request_ids, grafts, name):
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("give exactly one of prompts or prompt_token_ids")
        if isinstance(prompts, str):
            prompts = [prompts]
        items = list(prompts if prompts is not None else prompt_token_ids)
        if isinstance(params, (list, tuple)):
            if len(params) != len(items):
                raise ValueError(f"{name} has {len(params)} entries for {len(items)} prompts; "
                                 "pass one, or one per prompt")
            params = list(params)
        else:
            params = [params] * len(items)
        mms = _per_prompt(mm_inputs, items, "mm_inputs")
        names = _per_prompt(grafts, items, "grafts")
        ids = _per_prompt(request_ids, items, "request_ids")
        ids = [rid if rid is not None else f"generate-{next(self._gen_ids)}" for rid in ids]
        try:
            for rid, item, p, mm, graft in zip(ids, items, params, mms, names):
                if prompts is not None:
                    self.add_request(rid, item, p, mm_inputs=mm, graft=graft)
                else:
                    self.add_request(rid, prompt_token_ids=list(item), sampling_params=p,
                                     mm_inputs=mm, graft=graft)
        except Exception:  # leave nothing of this call queued
            for rid in ids:
                self.abort(rid)
            self._pending = [o for o in self._pending if o.request_id not in ids]
            raise
        final: dict[str, RequestOutput] = {}
        wanted = set(ids)
        while wanted - final.keys():
            for out in self.step():
                if out.finished and out.request_id in wanted:
                    final[out.request_id] = out
        return [_whole(final[rid]) for rid in ids]


def _per_prompt(values: list | None, items: list, name: str) -> list:
    if values is None:
        return [None] * len(items)
    if len(values) != len(items):
        raise ValueError(f"{name} has {len(values)} entries for {len(items)} prompts")
    return list(values)


def _whole(out: RequestOutput) -> RequestOutput:
    """An offline result reports everything as new."""
    out.new_token_ids, out.new_text = list(out.token_ids), out.text
    return out
