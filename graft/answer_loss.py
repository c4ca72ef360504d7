"""The training loss of a frozen causal LM on chat data, computed without the work that
cannot change it.

Two savings, both exact (same loss and projector gradients as HF's full-sequence forward,
up to float rounding):
- the LM head and the vocabulary softmax run only where a label is predicted (a few answer
  tokens per chat, against a 49k-wide head at every position);
- the prefix every row of the batch shares and that nothing trainable reaches (the system
  prompt and the user-turn header, before the first image) runs once, for one row, without
  autograd, and the rows continue from its KV cache: its forward is not repeated per row and
  its backward is not run at all.
The prefix is only shared when no LLM parameter trains (align stage) and activation
checkpointing is off (recomputation would append to the cache twice).
"""

from __future__ import annotations

import torch
from torch import nn

from graft.inject import IMAGE_PLACEHOLDER
from graft.template import IGNORE_INDEX

# a shared prefix shorter than this is not worth the extra decoder call
MIN_SHARED_PREFIX = 8
# config fields of LLM families whose head output is rescaled or capped before the loss; those
# keep HF's own forward (full-sequence logits) so the loss stays theirs
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale")


def answer_loss_applies(llm) -> bool:
    return not any(getattr(llm.config, k, None) for k in _LOGIT_TRANSFORMS)


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         labels: torch.Tensor) -> int:
    """Tokens at the start that every row has in common, with no image placeholder, no
    padding, and no position whose hidden state predicts a label; 0 when below
    MIN_SHARED_PREFIX."""
    stop = (input_ids != input_ids[:1]).any(0) | (input_ids[0] == IMAGE_PLACEHOLDER)
    stop |= (attention_mask == 0).any(0)
    # the hidden state at t predicts labels[:, t + 1]: keep it out of the prefix
    stop[:-1] |= (labels[:, 1:] != IGNORE_INDEX).any(0)
    stop[-1] = True  # at least one position must remain for the rows
    n = int(stop.int().argmax())  # first True
    return n if n >= MIN_SHARED_PREFIX else 0


def _prefix_can_be_shared(llm) -> bool:
    if any(p.requires_grad for p in llm.parameters()):
        return False
    return not any(getattr(m, "gradient_checkpointing", False) for m in llm.modules())


def answer_loss(llm, embeds: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the labelled tokens (HF's causal-LM loss: logits in fp32,
    labels shifted by one, IGNORE_INDEX skipped)."""
    decoder = llm.get_decoder()
    start = shared_prefix_length(input_ids, attention_mask, labels) if _prefix_can_be_shared(llm) else 0
    if start:
        with torch.no_grad():
            cache = decoder(inputs_embeds=embeds[:1, :start], use_cache=True).cache
        cache.batch_repeat_interleave(embeds.shape[0])
        hidden = decoder(inputs_embeds=embeds[:, start:], attention_mask=attention_mask,
                         cache=cache, use_cache=True).last_hidden_state
    else:
        hidden = decoder(inputs_embeds=embeds, attention_mask=attention_mask,
                         use_cache=False).last_hidden_state
    targets = labels[:, start + 1:]
    keep = targets != IGNORE_INDEX
    logits = llm.get_output_embeddings()(hidden[:, :-1][keep]).float()
    return nn.functional.cross_entropy(logits, targets[keep], reduction="sum") / keep.sum().clamp(min=1)
