"""train.sharding=fsdp: the frozen LLM sharded per decoder layer through accelerate's FSDP2
(torch's `fully_shard`), and the pieces the loop needs to stay independent of the world size:
full (gathered) trainable tensors for checkpoints, and the bytes each rank really holds.

The encoder is left out of FSDP: it runs in the data pipeline (or not at all, from the
feature cache), under no_grad, outside the sharded forward. The projector (and LoRA) train
as FSDP parameters, so their gradients are reduced as DDP would reduce them.
"""

from __future__ import annotations

import os
import resource

import torch

from graft.errors import GraftConfigError


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on CPU; for a sharded one every rank must call this (it all-gathers)."""
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


_ENV_FSDP = "ACCELERATE_USE_FSDP"
# what the launcher said, read at import: an Accelerator given a plugin sets the variable itself
_LAUNCHED_WITH_FSDP = os.environ.get(_ENV_FSDP, "false").lower() in ("true", "1")


def make_accelerator(spec, **kwargs):
    """An Accelerator for the spec's sharding. `kwargs` go to Accelerator (trackers)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if _LAUNCHED_WITH_FSDP and spec.train.sharding != "fsdp":
        raise GraftConfigError(
            "the launcher asked for FSDP (--use_fsdp / ACCELERATE_USE_FSDP) but "
            "train.sharding=none; add --set train.sharding=fsdp (graft configures FSDP itself)")
    if spec.train.cpu_offload and not torch.cuda.is_available():
        raise GraftConfigError("train.cpu_offload=true keeps FSDP shards in host memory between "
                               "their turns on a GPU; this machine has no GPU: set it false")
    plugin = None
    if not _LAUNCHED_WITH_FSDP:
        os.environ.pop(_ENV_FSDP, None)  # left by an earlier sharded train() in this process
    if spec.train.sharding == "fsdp":
        # layer classes and ignored modules are filled in by prepare_sharding() once the model exists
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap", reshard_after_forward=True,
            cpu_offload=spec.train.cpu_offload,
            state_dict_type="FULL_STATE_DICT", cpu_ram_efficient_loading=False)
    # each run sets up accelerate afresh: its state is a process-wide singleton that would keep
    # the precision and sharding of an earlier train() in this process (the process group stays)
    AcceleratorState._reset_state()
    accel = Accelerator(mixed_precision="bf16" if spec.train.precision == "bf16" else "no",
                        fsdp_plugin=plugin, **kwargs)
    if plugin is not None and accel.distributed_type == DistributedType.MULTI_CPU:
        # accelerate attaches an FSDP plugin only on accelerator devices; CPU ranks (gloo) run
        # the same FSDP2 path once the state says so
        accel.state.distributed_type = DistributedType.FSDP
        accel.state.fsdp_plugin = plugin
        if accel.mixed_precision != "no":
            plugin.set_mixed_precision(accel.mixed_precision)
    return accel


def is_sharded(accel) -> bool:
    from accelerate.utils import DistributedType

    return accel.distributed_type == DistributedType.FSDP


def _base(llm):
    """The HF model itself, under a LoRA (peft) wrapper or not."""
    return llm.get_base_model() if hasattr(llm, "get_base_model") else llm


def decoder_layer_classes(llm) -> list[str]:
    """The LLM's decoder-layer class names (HF's `_no_split_modules`): FSDP's wrapping units."""
    base = _base(llm)
    names = sorted(getattr(base, "_no_split_modules", None) or ())
    if not names:
        raise GraftConfigError(
            f"train.sharding=fsdp: {type(base).__name__} names no decoder layer class "
            "(_no_split_modules), so it cannot be sharded per layer; use train.sharding=none")
    return names


def broadcasts_llm(accel) -> bool:
    """Several sharded ranks: only rank 0 reads the LLM's weights; the others build the LLM on
    the meta device and receive their shards from it once sharded (`fill_meta_shards`), so
    host memory holds one whole LLM while loading, not one per rank."""
    return is_sharded(accel) and accel.num_processes > 1


def reads_llm_weights(accel) -> bool:
    """Whether this rank reads the LLM's weights from disk (see broadcasts_llm)."""
    return accel.is_main_process or not broadcasts_llm(accel)


def fill_meta_shards(model, llm_state: dict | None, device, optimizer) -> None:
    """After sharding: rank 0 broadcasts the LLM (`llm_state`, its whole state dict taken before
    sharding; None elsewhere) and every rank keeps its shard (torch's set_model_state_dict with
    broadcast_from_rank0); the non-persistent buffers (rotary tables), which no state dict
    holds, are broadcast whole. Every rank must call this, before the first optimizer step:
    the meta ranks get new parameter objects (LoRA's too), which `optimizer` is pointed at."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full, seen = {}, set()
    for k, v in (llm_state or {}).items():
        if v.data_ptr() not in seen:  # a tied tensor once: the tie is made again below
            seen.add(v.data_ptr())
            full[f"llm.{k}"] = v
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, full, options=options)
    _base(model.llm).tie_weights()  # loading by assignment (meta ranks) replaced one side of a tie
    trainable = [p for p in model.parameters() if p.requires_grad]
    (group,) = optimizer.param_groups  # one group, built from the same list in the same order
    if len(group["params"]) != len(trainable) or optimizer.state:
        raise RuntimeError("fill_meta_shards must run before the first optimizer step")
    group["params"] = trainable
    for _, module in sorted(model.llm.named_modules(), key=lambda kv: kv[0]):
        for name in sorted(module._non_persistent_buffers_set):
            buf = module._buffers.get(name)
            if buf is None:
                continue
            whole = torch.empty_like(buf, device=device) if buf.is_meta else buf.contiguous()
            dist.broadcast(whole, src=0)
            module._buffers[name] = whole
    left = [n for n, t in list(model.llm.named_parameters()) + list(model.llm.named_buffers())
            if _local(t).is_meta]
    if left:
        raise RuntimeError(f"LLM tensors still on the meta device after the broadcast: {left[:3]}")


def prepare_sharding(accel, model) -> None:
    """Tell accelerate's FSDP2 what to wrap: every decoder layer of the LLM as its own unit;
    the encoder stays whole (ignored); everything else joins the root unit."""
    plugin = accel.state.fsdp_plugin
    plugin.transformer_cls_names_to_wrap = decoder_layer_classes(model.llm)
    plugin.ignored_modules = [model.encoder]


def trainable_tensors(model) -> dict:
    """{"projector": its state dict, "lora": LoRA tensors or None}, whole and on CPU. Every
    rank must call it when sharded (gathers); only the main process needs the result."""
    projector = {k: _full(v) for k, v in model.projector.state_dict().items()}
    lora = None
    if hasattr(model.llm, "peft_config"):
        lora = {k: _full(v) for k, v in model.llm.state_dict().items() if "lora_" in k}
    return {"projector": projector, "lora": lora}


def load_trainable(model, tensors: dict) -> None:
    """Whole tensors from a checkpoint into the (possibly sharded) trainable modules."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full = {f"projector.{k}": v for k, v in tensors["projector"].items()}
    if tensors.get("lora"):
        full.update({f"llm.{k}": v for k, v in tensors["lora"].items()})
    options = StateDictOptions(full_state_dict=True, strict=False)
    result = set_model_state_dict(model, full, options=options)
    if result.unexpected_keys:
        raise GraftConfigError(f"checkpoint holds tensors this model lacks: {result.unexpected_keys[:4]}")


def optimizer_state(model, optimizer) -> dict:
    """The optimizer state keyed by parameter name, whole (every rank calls; the main process
    gets it), so a checkpoint loads at any number of ranks and with or without sharding."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_optimizer_state(model, optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if state["state"] and all(isinstance(k, int) for k in state["state"]):
        optimizer.load_state_dict(state)  # a checkpoint from before name-keyed states
        return
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def peak_rss() -> int:
    """This process's peak resident memory so far, in bytes (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_report(accel, llm, read_weights: bool, rss_before_model: int) -> dict:
    """The LLM's bytes in all, the bytes of it resident on each rank, whether each rank read
    the LLM's weights from disk, and each rank's peak RSS (and what it was before the model
    loaded) and peak device memory (measured; every rank calls, collectives inside)."""
    from accelerate.utils import gather_object

    whole = sum(p.numel() * p.element_size() for p in llm.parameters())
    local = sum(_local(p).numel() * p.element_size() for p in llm.parameters())
    device = torch.cuda.max_memory_allocated() if accel.device.type == "cuda" else None
    row = (local, peak_rss(), device, read_weights, rss_before_model)
    rows = gather_object([row]) if accel.num_processes > 1 else [row]
    return {"llm_param_bytes": whole,
            "llm_param_bytes_per_rank": [r[0] for r in rows],
            "peak_rss_bytes_per_rank": [r[1] for r in rows],
            "peak_rss_before_model_bytes_per_rank": [r[4] for r in rows],
            "peak_device_memory_bytes_per_rank": [r[2] for r in rows],
            "llm_weights_read_per_rank": [r[3] for r in rows]}

