"""The in-process serving engine as a backend: all requests queued at once, continuous batching.

TTFT and latency come from the engine's own request timestamps, so they include the time a
request waited in the queue behind the rest of the task.
"""

from __future__ import annotations

from pathlib import Path

from graft.evals.backends.base import Request, Result, load_images
from graft.run_dir import model_dir_kind


class EngineBackend:
    def __init__(self, path: str | Path, config=None, chunk: int = 64, device: str = "cpu",
                 quantization=None):
        from graft.serving import Engine, EngineConfig

        self.chunk = chunk
        self.quantization = quantization  # a base_llm reference runs under the same weights
        path = Path(path)
        config = config or EngineConfig(device=device, quantization=quantization)
        if model_dir_kind(path) == "run":
            from graft.serving.multimodal.front import load_engine

            self.engine = load_engine(path, config)
        else:
            self.engine = Engine.from_pretrained(path, config)
        self.front = getattr(self.engine, "mm", None)  # multimodal front of a run dir, else None
        if self.front is not None:
            from graft.evals.backends.hf import grafted_identity

            self.identity = "engine-" + grafted_identity(self.front.model)
            self.base_llm = self.front.llm_path
        else:
            from graft.io import weights_sha256

            self.identity = f"engine-llm:{weights_sha256(path)[:32]}"
            self.base_llm = str(path)
        plan = self.engine.runner.quant_plan
        if any(s.kind != "fp32" for s in plan.values()):  # other weights, other answers: own cache keys
            from graft.serving.models.quantize import plan_digest

            self.identity += f"+quant:{plan_digest(plan)}"
        self._next = 0

    def _prompt(self, req: Request, rid: str):
        if self.front is not None:
            return self.front.prepare_chat(req.messages, load_images(req.images), owner=rid)
        if req.images:
            raise ValueError("this engine serves a plain LLM; image tasks need a run dir")
        from graft.template import encode_chat

        return encode_chat(self.engine.tokenizer, req.messages, [], add_generation_prompt=True).input_ids, None

    def generate(self, requests: list[Request]) -> list[Result]:
        # chunks bound the image embeddings pinned in the encoder cache at one time
        out: list[Result] = []
        for i in range(0, len(requests), self.chunk):
            out.extend(self._generate_chunk(requests[i:i + self.chunk]))
        return out

    def _generate_chunk(self, requests: list[Request]) -> list[Result]:
        from graft.serving import SamplingParams

        results: dict[str, Result] = {}
        rids = []
        for req in requests:
            rid = f"eval-{self._next}"
            self._next += 1
            rids.append(rid)
            try:
                ids, mm = self._prompt(req, rid)
                params = SamplingParams(temperature=req.temperature, max_tokens=req.max_new_tokens,
                                        seed=req.seed if req.temperature > 0 else None)
                self.engine.add_request(rid, prompt_token_ids=ids, sampling_params=params, mm_inputs=mm)
            except Exception as err:  # noqa: BLE001 - one bad sample must not stop the run
                results[rid] = Result(None, error=f"{type(err).__name__}: {err}")
        while len(results) < len(rids):
            for out in self.engine.step():
                if not out.finished or out.request_id in results:
                    continue
                if self.front is not None:
                    self.front.cache.release(out.request_id)
                start = out.arrival_time
                ttft = None if out.first_token_time is None else out.first_token_time - start
                latency = None if out.finish_time is None else out.finish_time - start
                error = (out.error if out.finish_reason in ("error", "internal_error", "abort", "deadline")
                         else None)
                text = None if error else out.text.strip()
                results[out.request_id] = Result(text, latency=latency, ttft=ttft, error=error)
        return [results[rid] for rid in rids]

    def close(self) -> None:
        self.engine = None
