"""SGLang's worker info, as sglang-router reads it when a worker registers and while it runs:
GET /get_model_info (/model_info), /get_server_info (/server_info) and /get_load. Field
names follow SGLang's http_server; `load` is what vLLM's gauges (vllm_metrics.py) read too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Load:
    running: int  # sequences the engine's scheduler is running
    waiting: int  # requests not yet running: queued in the server or in the scheduler
    kv_tokens: int  # KV slots held (blocks in use x block size)
    kv_usage: float  # blocks in use / blocks in the pool, 0..1
    waiting_tokens: int  # prompt tokens of the waiting requests, still to prefill


def load(ctx) -> Load:
    """Plain length reads beside the engine thread (no lock; a scrape may be a step late)."""
    engine = ctx.engine
    used, total = engine.kv_usage()
    queued, queued_tokens = ctx.worker.queued_prompts()
    scheduled = list(engine.scheduler.waiting)
    return Load(running=len(engine.scheduler.running), waiting=queued + len(scheduled),
                kv_tokens=used * engine.config.block_size,
                kv_usage=used / total if total else 0.0,
                waiting_tokens=queued_tokens + sum(len(s) - s.num_computed_tokens
                                                   for s in scheduled))


def _serves_images(ctx) -> bool:
    return any(front is not None for front in ctx.models.values())


def model_info(ctx) -> dict[str, Any]:
    """SGLang's GET /get_model_info (sglang-router labels a worker with model_type and
    architectures from it)."""
    engine, hf = ctx.engine, ctx.engine.runner.hf_config
    return {"model_path": str(engine.model_dir), "tokenizer_path": str(engine.model_dir),
            "is_generation": True, "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": _serves_images(ctx),
            "has_audio_understanding": False, "model_type": getattr(hf, "model_type", None),
            "architectures": list(getattr(hf, "architectures", None) or [])}


def server_info(ctx) -> dict[str, Any]:
    """SGLang's GET /get_server_info: its server arguments and scheduler limits under SGLang's
    names (sglang-router takes the worker's model id from served_model_name)."""
    from graft import __version__

    engine, cfg = ctx.engine, ctx.engine.config
    block, blocks = cfg.block_size, engine.block_manager.num_blocks
    return {"model_path": str(engine.model_dir), "tokenizer_path": str(engine.model_dir),
            "served_model_name": ctx.settings.model_name, "is_embedding": False,
            "skip_tokenizer_init": False, "context_length": ctx.max_model_len,
            "dp_size": 1, "tp_size": 1, "pp_size": 1, "page_size": block,
            "block_size": block,  # vllm-router's kv index asks /get_server_info for it
            "max_running_requests": cfg.max_num_seqs,
            "chunked_prefill_size": cfg.max_num_batched_tokens,
            "max_prefill_tokens": cfg.max_num_batched_tokens,
            "max_total_num_tokens": blocks * block, "max_req_input_len": ctx.max_model_len - 1,
            "disaggregation_mode": "null", "enable_multimodal": _serves_images(ctx),
            "version": __version__, "engine": "graft",
            "internal_states": [{"num_running_reqs": load(ctx).running}]}


def get_load(ctx) -> list[dict[str, Any]]:
    """SGLang's GET /get_load: one entry per data-parallel rank (graft has one);
    sglang-router's power_of_two sums num_tokens over the entries. As SGLang's scheduler:
    the KV slots in use plus the waiting requests' prompt tokens."""
    now = load(ctx)
    return [{"rid": None, "http_worker_ipc": None, "dp_rank": None,
             "num_reqs": now.running + now.waiting, "num_waiting_reqs": now.waiting,
             "num_tokens": now.kv_tokens + now.waiting_tokens}]
