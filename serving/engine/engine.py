"""The engine: requests in, tokens (or embeddings) out. The incremental add_request / step /
abort interface the server streams from; offline `generate` and `embed` (offline.py) run on it.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from pathlib import Path

from graft.serving.engine import pooling, prompt_logprobs
from graft.serving.engine.block_manager import BlockManager
from graft.serving.engine.config import EngineConfig
from graft.serving.engine.grammar_check import GrammarLimitError
from graft.serving.engine.logits_processors import NoTokenLeft
from graft.serving.engine.guided import GrammarTokenizer, advance
from graft.serving.engine.kv_transfer import KVExports, KVPayload, import_into
from graft.serving.engine.mm_inputs import MultiModalInputs
from graft.serving.engine.offline import OfflineRuns
from graft.serving.engine.outputs import Detokenizer, RequestOutput, find_stop_string, make_output
from graft.serving.engine.sampler import restore_rng_states, seeded_rng_states
from graft.serving.engine.pooling import PoolingParams
from graft.serving.engine.sampling_params import SamplingParams
from graft.serving.engine.scheduler import Scheduler
from graft.serving.engine.sequence import Sequence, prompt_problem
from graft.serving.engine.spec_decode.controller import SpecDecoder
from graft.serving.engine.spec_decode.verify import sample_step
from graft.serving.engine.stats import EngineStats
from graft.serving.engine.step_cost import StepCostModel
from graft.serving.engine.tokenizer import eos_token_ids, load_tokenizer
from graft.serving.multimodal.front import DEFAULT_CACHE_BYTES
from graft.serving.multimodal.grafts import GraftSet, load_grafts

log = logging.getLogger("graft.serving")


class Engine(OfflineRuns):
    """One LLM and the grafts it serves (`grafts`, fixed at construction; a bare LLM serves
    none). Build it with `from_pretrained` / `from_grafts`, which go through the one loader."""

    def __init__(self, model_dir: str | Path, config: EngineConfig | None = None, tokenizer=None,
                 grafts: GraftSet | None = None):
        from graft.serving.engine.model_runner import ModelRunner
        from graft.serving.engine.sampler import Sampler

        self.model_dir = Path(model_dir)
        self.config = config or EngineConfig()
        self.runner = ModelRunner(self.model_dir, self.config)
        self.max_model_len = self.runner.max_model_len
        self.block_manager = BlockManager(self.runner.num_blocks, self.config.block_size,
                                          self.config.enable_prefix_caching)
        self.scheduler = Scheduler(self.config, self.block_manager)
        # prefill/decode split: prompts whose KV waits for a decode engine (kv_transfer.py)
        self.kv_exports = self.scheduler.exports = KVExports(self.block_manager)
        self.cost = StepCostModel()  # every step this engine runs is recorded in it
        # always present: a request may turn speculation on while the engine default is off;
        # it weighs acceptance against the measured cost of verify steps
        self.spec = self.scheduler.spec = SpecDecoder(self.config, self.max_model_len, self.cost)
        if tokenizer is None and grafts is not None:
            tokenizer = grafts.tokenizer
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.model_dir)
        self.grafts = grafts if grafts is not None else GraftSet.empty(self.model_dir, self.tokenizer)
        self.detokenizer = Detokenizer(self.tokenizer)
        self.eos_token_ids = eos_token_ids(self.model_dir, self.runner.hf_config, self.tokenizer)
        self.sampler = Sampler(self.runner.device, self.config.seed, self.eos_token_ids)
        # guided_json requests: llguidance's view of the tokenizer, built on the first one
        self.grammar_tokenizer = GrammarTokenizer(self.tokenizer, self.runner.vocab_size,
                                                  self.eos_token_ids)
        self.seqs: dict[str, Sequence] = {}  # unfinished requests by id
        self._pending: list[RequestOutput] = []  # finished at admission (bad input)
        self._order = itertools.count()

    @classmethod
    def from_pretrained(cls, path: str | Path, config: EngineConfig | None = None,
                        cache_bytes: int = DEFAULT_CACHE_BYTES, **kwargs) -> "Engine":
        """An LLM dir (text only) or a run dir with graft.yaml (encoder + projector + LLM;
        its graft is the default one, `engine.mm`)."""
        return cls._load(path, config, None, cache_bytes, **kwargs)

    @classmethod
    def from_grafts(cls, grafts: dict[str, str | Path], config: EngineConfig | None = None,
                    llm: str | Path | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES,
                    **kwargs) -> "Engine":
        """One engine (one LLM copy, one KV pool) serving several run dirs trained on the same
        LLM (checked by sha256): `engine.grafts[name]` is each graft's multimodal front."""
        from graft.errors import GraftConfigError

        if not isinstance(grafts, dict):  # (an empty one: the loader names the fix)
            raise GraftConfigError(f"from_grafts takes {{name: run dir}}, got {type(grafts).__name__}")
        return cls._load(grafts, config, llm, cache_bytes, **kwargs)

    @classmethod
    def _load(cls, source, config, llm, cache_bytes, **kwargs) -> "Engine":
        device = (config or EngineConfig()).device
        # "~/models/x" as in a YAML spec: the shell did not expand it for a Python caller
        home = lambda p: None if p is None else os.path.expanduser(str(p))  # noqa: E731
        source = {k: home(v) for k, v in source.items()} if isinstance(source, dict) else home(source)
        graft_set = load_grafts(source, home(llm), cache_bytes, device=device)
        return cls(graft_set.llm_path, config, grafts=graft_set, **kwargs)

    @property
    def mm(self):
        """The default graft's multimodal front (a run dir served alone), else None."""
        return self.grafts.front()

    # --- requests -------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int] | None = None,
                    sampling_params: SamplingParams | PoolingParams | None = None, *,
                    prompt_token_ids: list[int] | None = None,
                    mm_inputs: MultiModalInputs | None = None, deadline: float | None = None,
                    priority: int | None = None, graft: str | None = None,
                    kv_export: bool = False, kv_import: KVPayload | None = None) -> None:
        """Queue a request. Bad sampling settings raise; a prompt the model cannot take
        finishes this request alone with finish_reason "error" (reported by the next step).
        With PoolingParams the request is an embedding (pooling.py): nothing is sampled.

        Prefill/decode split: `kv_export` holds the prompt's KV once the request finishes,
        for `kv_exports.take`; `kv_import` (a KVPayload another engine exported) gives the
        prompt's leading tokens their KV without computing it, or, when it cannot be used,
        is counted in `kv_exports.stats` and the prompt is prefilled as usual."""
        if request_id in self.seqs:
            raise ValueError(f"request_id {request_id!r} is already running; use a unique id")
        if isinstance(prompt, (list, tuple)):
            prompt, prompt_token_ids = None, list(prompt)
        if (prompt is None) == (prompt_token_ids is None):
            raise ValueError("add_request needs exactly one of prompt (str) or prompt_token_ids")
        params, pool = sampling_params or SamplingParams(), None
        if isinstance(params, PoolingParams):
            params, pool = SamplingParams(speculative="off"), params
        if not isinstance(params, SamplingParams):
            raise ValueError("sampling_params must be a SamplingParams or PoolingParams, got "
                             f"{type(params).__name__}")
        params.check_vocab(self.runner.vocab_size)
        if prompt is not None:
            if self.tokenizer is None:
                raise ValueError(f"{self.model_dir} has no tokenizer: pass prompt_token_ids")
            prompt_token_ids = self.tokenizer(prompt)["input_ids"]
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt_token_ids):
            raise ValueError(f"request {request_id!r}: prompt_token_ids must be a list of ints")
        seq = Sequence(request_id, prompt_token_ids, params, next(self._order), mm_inputs,
                       deadline, priority, graft)
        seq.pooling = pool
        problem = prompt_problem(seq, self.max_model_len, self.runner.vocab_size)
        if problem is not None:
            seq.finish_reason, seq.error = "error", problem
            seq.finish_time = time.monotonic()
            self._pending.append(make_output(seq, final=True))
            return
        if params.guided_grammar is not None:  # one matcher per sequence, fresh from its grammar
            matcher = self.grammar_tokenizer.matcher(params.guided_grammar)
            if params.guided_after_token is None:
                seq.matcher = matcher
            else:
                seq.waiting_matcher = matcher
        seq.kv_export = kv_export
        if kv_import is not None and not pooling.whole_prompt(seq):
            seq.num_transferred_tokens = import_into(self.runner, self.block_manager, seq,
                                                     kv_import, self.kv_exports.stats)
        self.seqs[request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its blocks; no further output is reported for it."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq, "abort")
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.seqs or self._pending)

    # --- one step -------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduled batch; return an output for every request that moved or finished."""
        t0 = time.perf_counter()  # the cost model times scheduling too: admission waits on it
        outputs, self._pending = self._pending, []
        self.kv_exports.expire()
        if self.kv_exports.held:
            self.kv_exports.make_room(self.scheduler.blocks_wanted())
        batch, dropped = self.scheduler.schedule()
        dropped += self._drop_bad_images(batch)
        for seq in dropped:
            self.seqs.pop(seq.request_id, None)
            outputs.append(make_output(seq, final=True))
        if not batch:
            return outputs
        rngs = seeded_rng_states(batch.seqs)
        try:
            logits, sampling, scored, pooled = self.runner.execute(batch)
            tokens, logprobs = self._sample(logits, sampling)
            prompt_logprobs.record(scored)
            pooling.record(pooled)
            self._record_timing(batch, time.perf_counter() - t0)
        except Exception:  # noqa: BLE001 - the batch failed; find whose request did it
            restore_rng_states(rngs)  # seeded rows redraw what the failed batch drew
            sampling, tokens, logprobs = self._run_each_alone(batch)
        for seq, n in zip(batch.seqs, batch.num_tokens):
            if seq.is_finished:  # failed alone: its blocks are already freed
                self.seqs.pop(seq.request_id, None)
                outputs.append(make_output(seq, final=True))
                continue
            seq.num_computed_tokens += n - len(seq.spec_tokens)  # proposals: once accepted
            self.block_manager.commit(seq)
            if pooling.done(seq):  # an embedding's prompt is computed: it is finished
                seq.embedding = pooling.embed(seq)
                self.scheduler.finish(seq, "stop")
                self.seqs.pop(seq.request_id, None)
                outputs.append(make_output(seq, final=True))
        now = time.monotonic()
        decoding = batch.num_decodes + sum(1 for s in batch.seqs if s.spec_tokens)
        proposals = sum(len(s.spec_tokens) for s in batch.seqs)
        for seq, toks, lps in zip(sampling, tokens, logprobs):
            try:
                self._append_tokens(seq, toks, lps, now, decoding, proposals)
            except Exception as err:  # noqa: BLE001 - e.g. detokenizing; this request only
                self._fail(seq, err)
            outputs.append(make_output(seq, final=seq.is_finished))
            if seq.is_finished:
                self.seqs.pop(seq.request_id, None)
        return outputs

    def _run_each_alone(self, batch):
        """After a failed batched step: run each sequence as a batch of one, so one request's
        failure (its seed, its logprobs, its data) finishes that request alone. Rewriting the
        same KV slots is harmless; the others' tokens are the ones they get alone (seeded
        rows' generators are back where they stood before the failed batch)."""
        from graft.serving.engine.scheduler import ScheduledBatch

        sampling, tokens, logprobs = [], [], []
        for seq, n in zip(batch.seqs, batch.num_tokens):
            try:
                logits, sampled, scored, pooled = self.runner.execute(
                    ScheduledBatch([seq], [n], int(n == 1)))
                prompt_logprobs.record(scored)
                pooling.record(pooled)
                if sampled:
                    got, lps = self._sample(logits, sampled)
                    sampling += sampled
                    tokens += got
                    logprobs += lps
            except Exception as err:  # noqa: BLE001
                self._fail(seq, err)
        return sampling, tokens, logprobs

    def _fail(self, seq: Sequence, err: Exception) -> None:
        """Finish seq with finish_reason "internal_error" (blocks freed); others go on. A
        grammar over llguidance's limits met mid-generation, or allowed_token_ids and bad
        words that leave no token, are the request's own "error"."""
        if seq.is_finished:
            return
        if isinstance(err, (GrammarLimitError, NoTokenLeft)):
            log.warning("request %r: %s", seq.request_id, err)
            self.scheduler.finish(seq, "error", str(err))
            return
        log.exception("request %r failed inside the engine", seq.request_id)
        self.scheduler.finish(seq, "internal_error",
                              f"request {seq.request_id!r} failed inside the engine: "
                              f"{type(err).__name__}: {err}")

    def _drop_bad_images(self, batch) -> list[Sequence]:
        """Resolve this step's image rows up front; a request whose rows fail is finished
        with an error instead of failing the whole batch."""
        bad = []
        for seq, n in zip(batch.seqs, batch.num_tokens):
            if seq.mm_inputs is None:
                continue
            try:
                rows = seq.mm_inputs.rows_for(seq.num_computed_tokens, seq.num_computed_tokens + n)
                if rows is not None and rows.shape[-1] != self.runner.hidden_size:
                    raise ValueError(f"image embeddings have width {rows.shape[-1]}, the model's "
                                     f"hidden size is {self.runner.hidden_size}")
            except Exception as err:  # the embedding source is opaque (an encoder call)
                bad.append(seq)
                self.scheduler.finish(seq, "error", f"request {seq.request_id!r}: {err}")
        if bad:
            keep = [(s, n) for s, n in zip(batch.seqs, batch.num_tokens) if not s.is_finished]
            batch.num_decodes = sum(1 for s, n in keep if n == 1)
            batch.seqs, batch.num_tokens = [s for s, _ in keep], [n for _, n in keep]
        return bad

    def _sample(self, logits, sampling: list[Sequence]) -> tuple[list[list[int]], list[list]]:
        """New tokens (and logprob entries) per sampling sequence (spec_decode.verify)."""
        return sample_step(self.sampler, logits, sampling)

    def _append_tokens(self, seq: Sequence, tokens: list[int], logprobs: list, now: float,
                       decoding: int = 1, proposals: int = 0) -> None:
        """Append a step's tokens; after a verify step, drop the rejected proposals' KV
        (`decoding`: sequences that decoded in this step, `proposals`: the tokens all of them
        proposed, for the adaptive rule)."""
        draft, seq.spec_tokens = seq.spec_tokens, []
        for j, (token, lp) in enumerate(zip(tokens, logprobs)):
            self._append_token(seq, token, lp, now)
            if seq.is_finished:
                break
            if j < len(tokens) - 1:  # an accepted proposal: its KV was computed this step
                seq.num_computed_tokens += 1
        if draft:
            self.spec.record(seq, len(draft), len(tokens) - 1, decoding, proposals)
            if not seq.is_finished:
                self.block_manager.rollback(seq)
                self.block_manager.commit(seq)
        if seq.is_finished:
            self.spec.observe(seq)

    def _append_token(self, seq: Sequence, token: int, logprob, now: float) -> None:
        seq.token_ids.append(token)
        if logprob is not None:
            seq.logprobs.append(logprob)
        if seq.first_token_time is None:
            seq.first_token_time = now
        params = seq.params
        reason = None
        # the grammar is complete: nothing more may follow (its last token is part of the text)
        grammar_done = seq.matcher is not None and advance(seq.matcher, token)
        if seq.waiting_matcher is not None and token == params.guided_after_token:
            seq.matcher, seq.waiting_matcher = seq.waiting_matcher, None  # from the next token
        eos = not params.ignore_eos and token in self.eos_token_ids
        if eos or token in params.stop_token_ids:
            reason = "stop"  # the stop token's text is not added
            seq.stop_reason = None if eos else token  # vLLM's: eos says None
        else:
            old_len = len(seq.text)
            self.detokenizer.append(seq)
            if params.stop and seq.num_output_tokens >= params.min_tokens:  # as vLLM
                found = find_stop_string(seq, old_len)
                if found is not None:
                    seq.text = seq.text[:found[0]]
                    seq.stop_reason, reason = found[1], "stop"
        if reason is None and grammar_done:
            reason = "stop"
        if reason is None and (seq.num_output_tokens >= params.max_tokens
                               or len(seq) >= self.max_model_len):
            reason = "length"
        if reason is not None:
            self.scheduler.finish(seq, reason)

    def _record_timing(self, batch, seconds: float) -> None:
        decodes = batch.num_decodes  # one-token rows; prefill chunks and verify rows are tokens
        verify_rows = sum(n for s, n in zip(batch.seqs, batch.num_tokens) if s.spec_tokens)
        self.cost.observe_step(batch.total_tokens - decodes, decodes, seconds, verify_rows)

    def kv_usage(self) -> tuple[int, int]:
        """(KV blocks in use, blocks in the pool); safe to read beside the engine thread."""
        bm = self.block_manager
        return bm.num_blocks - bm.num_free_blocks, bm.num_blocks

    def clear_deadline(self, request_id: str) -> None:
        """Drop a running request's deadline (a server's first-token budget, once met)."""
        seq = self.seqs.get(request_id)
        if seq is not None:
            seq.deadline = None

    def stats(self) -> EngineStats:
        return EngineStats.of(self)
