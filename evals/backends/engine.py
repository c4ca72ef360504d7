"""The in-process serving engine as a backend: all requests queued at once, continuous batching.

TTFT and latency come from the engine's own request timestamps, so they include the time a
request waited in the queue behind the rest of the task.
"""

from __future__ import annotations

from pathlib import Path

from graft.evals.backends.base import Request, Result, load_images


class EngineBackend:
    def __init__(self, path: str | Path, config=None, chunk: int = 64, device: str = "cpu",
                 quantization=None):
        from graft.serving import Engine, EngineConfig

        self.chunk = chunk
        path = Path(path)
        config = config or EngineConfig(device=device, quantization=quantization)
        self.quantization = config.quantization  # a base_llm reference runs under the same weights
        self.engine = Engine.from_pretrained(path, config)
        self.front = self.engine.mm  # multimodal front of a run dir, else None
        if self.front is not None:
            from graft.evals.backends.hf import grafted_identity

            projector = self.front.image_path.projector.named_parameters(prefix="projector")
            self.identity = "engine-" + grafted_identity(self.front.spec, projector)
            self.base_llm = self.front.llm_path
        else:
            from graft.io import weights_sha256

            self.identity = f"engine-llm:{weights_sha256(path)[:32]}"
            self.base_llm = str(path)
        plan = self.engine.runner.quant_plan
        from graft.serving.models.quant_config import changes_weights, plan_digest

        if changes_weights(plan, self.engine.runner.dtype):  # other weights, other answers: own cache keys
            self.identity += f"+quant:{plan_digest(plan)}"
        # activations or a KV cache in other precisions give other answers too (the defaults,
        # fp32 throughout, add nothing: identities from before these options stay valid)
        if config.dtype != "float32":
            self.identity += f"+{config.dtype}"
        if config.kv_torch_dtype != config.torch_dtype:
            self.identity += f"+kv:{str(config.kv_torch_dtype).removeprefix('torch.')}"
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

        results: dict[int, Result] = {}
        ready: dict[int, tuple] = {}  # request index -> (prompt ids, mm_inputs, params)
        owners = []
        for k, req in enumerate(requests):
            owner = f"eval-{self._next}"  # pins this request's image embeddings
            self._next += 1
            owners.append(owner)
            try:
                ids, mm = self._prompt(req, owner)
                ready[k] = (ids, mm, SamplingParams(
                    temperature=req.temperature, max_tokens=req.max_new_tokens,
                    seed=req.seed if req.temperature > 0 else None))
            except Exception as err:  # noqa: BLE001 - one bad sample must not stop the run
                results[k] = Result(None, error=f"{type(err).__name__}: {err}")
        try:
            outs = self.engine.generate(prompt_token_ids=[r[0] for r in ready.values()],
                                        mm_inputs=[r[1] for r in ready.values()],
                                        sampling_params=[r[2] for r in ready.values()])
        finally:
            if self.front is not None:
                for owner in owners:
                    self.front.cache.release(owner)
        for k, out in zip(ready, outs):
            start = out.arrival_time
            ttft = None if out.first_token_time is None else out.first_token_time - start
            latency = None if out.finish_time is None else out.finish_time - start
            error = (out.error if out.finish_reason in ("error", "internal_error", "abort", "deadline")
                     else None)
            results[k] = Result(None if error else out.text.strip(), latency=latency, ttft=ttft,
                                error=error)
        return [results[k] for k in range(len(requests))]

    def close(self) -> None:
        self.engine = None
