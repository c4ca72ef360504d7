"""The engine's one background thread: admits jobs, encodes their images within a per-step
encoder budget, steps the engine while work exists and hands outputs to per-request sinks.

The HTTP layer never touches the engine; it submits jobs and reads events from a sink.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable

from graft.errors import GraftError
from graft.kernels.omp_threads import release_thread_pool
from graft.serving.http.job import Job
from graft.serving.http.plumbing.admission import AdmissionController, QueueItem, QueueLimits
from graft.serving.http.openai.openai_chat import APIError
from graft.serving.http.finish_errors import finish_error, internal_error

log = logging.getLogger("graft.serving")


class EngineWorker:
    def __init__(self, engine, metrics=None, encoder_tokens_per_step: int = 4096,
                 admission_slack: float = 1.0, max_queued: int | None = None,
                 max_queued_tokens: int | None = None):
        self.engine = engine
        # every graft's front whose jobs may come; they share the engine's one encoder cache
        self.fronts = list(engine.grafts.fronts.values())
        self.cache = engine.grafts.cache
        self.metrics = metrics
        self.encoder_tokens_per_step = encoder_tokens_per_step
        self.cost = engine.cost  # the engine fits it on every step; encodes are added here
        self.admission = AdmissionController(self.cost, engine.config.max_num_batched_tokens,
                                             admission_slack,
                                             prefill_tokens=engine.config.step_prefill_tokens)
        self.limits = QueueLimits(self.admission, max_queued, max_queued_tokens)
        self.pending: list[Job] = []  # admitted, images not yet encoded: EDF order
        self.active: dict[str, Job] = {}  # inside the engine
        self._aborts: list[str] = []
        self._calls: list[Callable[[], None]] = []  # run on the engine thread (call())
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="graft-engine", daemon=True)
        self.tracer = None  # trace_log.TraceWriter under graft serve --trace

    def warmup(self) -> None:
        """A few real steps (and encodes) before serving, so the first admission decisions
        use costs measured on this machine rather than priors."""
        from PIL import Image

        from graft.serving.engine.sampling_params import SamplingParams

        engine = self.engine
        vocab = engine.runner.vocab_size
        n = max(2, min(engine.config.max_num_batched_tokens, engine.max_model_len // 2, 96))
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        for i, length in enumerate((max(2, n // 4), n, max(2, n // 2))):
            ids = [(7 * i + 3 * k + 1) % vocab for k in range(length)]  # no shared prefix
            engine.add_request(f"graft-warmup-{i}", prompt_token_ids=ids, sampling_params=params)
            while engine.has_unfinished_requests():
                for out in self._run_once([]):
                    if out.finish_reason == "internal_error":  # refuse to serve, loudly
                        raise GraftError(f"engine warmup failed: {out.error}")
        # nobody will ask for the warmup's prompts: their blocks are no cache, and their
        # lookups no queries in vllm:prefix_cache_* (a fresh worker starts at 0 of 0)
        engine.block_manager.reset_prefix_cache()
        engine.block_manager.hit_tokens = engine.block_manager.query_tokens = 0
        for front in self.fronts:
            image = Image.new("RGB", (224, 224), (128, 128, 128))
            n_tokens = front.image_path.image_token_count(224, 224)
            for _ in range(2):  # the first call pays one-time setup; keep the second
                start = time.perf_counter()
                front.image_path.image_features([image])
                elapsed = time.perf_counter() - start
            self.cost.observe_encode(n_tokens, elapsed)
        release_thread_pool()  # the engine thread computes from now on (graft.kernels.omp_threads)

    # ---- called from the HTTP layer (any thread) ----------------------------------------
    def start(self) -> None:
        release_thread_pool()  # this thread loaded the model; only the engine thread computes now
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the engine thread is running."""
        return self._thread.is_alive()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=30)

    def submit(self, job: Job, budget_s: float | None) -> float:
        """Admission control, then queue; returns the TTFT estimate or raises APIError(429)."""
        died = self._thread.ident is not None and not self._thread.is_alive()
        if died or self._stop:  # (never started: driven by hand with _run_once, as in tests)
            raise APIError("the engine thread is not running; see the server log",
                           status=503, type="server_error", code="engine_down")
        with self._cond:
            queue, decoding = self._queue_locked()
            self.limits.check(queue, decoding, job.queue_item())
            estimate = self.admission.admit(job.queue_item(), budget_s, queue, decoding)
            job.estimate_s = estimate
            self.pending.append(job)
            self.pending.sort(key=lambda j: j.queue_item().deadline)
            self._cond.notify()
        return estimate

    def check_queue_room(self) -> None:
        """APIError(429) with a Retry-After when the queue is already at its limits."""
        with self._cond:
            self.limits.check(*self._queue_locked())

    def _queue_locked(self) -> tuple[list[QueueItem], int]:
        """(jobs waiting for their first token, number of decoding jobs)."""
        queue = [j.queue_item() for j in self.pending]
        queue += [j.queue_item() for j in self.active.values() if j.first_token_at is None]
        decoding = sum(1 for j in self.active.values() if j.first_token_at is not None)
        return queue, decoding

    def abort(self, request_id: str) -> None:
        with self._cond:
            self._aborts.append(request_id)
            self._cond.notify()

    def queue_depth(self) -> int:
        with self._cond:
            return len(self.pending) + sum(1 for j in self.active.values()
                                           if j.first_token_at is None)

    def queued_prompts(self) -> tuple[int, int]:
        """(jobs admitted but not in the engine yet, their prompt tokens)."""
        with self._cond:
            return len(self.pending), sum(len(j.prompt_token_ids) for j in self.pending)

    def num_running(self) -> int:
        return len(self.active)

    def call(self, fn: Callable[[], object]) -> asyncio.Future:
        """fn() on the engine thread before its next step (for what touches the block pool,
        e.g. handing a prompt's KV to another worker); await the result on the event loop."""
        if not self.alive:
            raise APIError("the engine thread is not running; see the server log",
                           status=503, type="server_error", code="engine_down")
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def run() -> None:
            try:
                result, error = fn(), None
            except Exception as err:  # noqa: BLE001 - handed to the awaiting request
                result, error = None, err
            loop.call_soon_threadsafe(_settle, future, result, error)

        with self._cond:
            self._calls.append(run)
            self._cond.notify()
        return future

    # ---- the engine thread ----------------------------------------------------------------
    def _loop(self) -> None:
        from graft.threads import ThreadRecheck

        recheck = ThreadRecheck()  # on this thread: torch's thread count is per thread
        while True:
            with self._cond:
                while not (self._stop or self._aborts or self.pending or self._calls
                           or self.engine.has_unfinished_requests()):
                    # held P/D exports expire even when nothing else happens
                    if not self._cond.wait(timeout=0.5 if self.engine.kv_exports.held else None):
                        self.engine.kv_exports.expire()
                if self._stop:
                    break
                aborts, self._aborts = self._aborts, []
                calls, self._calls = self._calls, []
            for run in calls:
                run()
            try:
                self._run_once(aborts)
                recheck.tick()
            except Exception:  # noqa: BLE001 - a fault no single request explains: the
                # engine isolates per-request failures itself; never let this kill the thread
                log.exception("engine step failed")
                self._fail_all(internal_error())

    def _run_once(self, aborts: list[str]) -> list:
        """Aborts, expiries, admissions and one engine step; returns the step's outputs."""
        for rid in aborts:
            self._abort_now(rid)
        self._expire_pending()
        self._admit_some()
        if self.engine.has_unfinished_requests():
            outputs = self.engine.step()  # the engine records the step in the cost model
            for out in outputs:
                self._deliver(out)
            return outputs
        if self.pending:
            # Work that cannot start yet (no cache room) beside an idle engine: wait for a
            # change (new request, abort, stop) rather than spin.
            with self._cond:
                self._cond.wait(timeout=0.05)
        return []

    def _abort_now(self, rid: str) -> None:
        with self._cond:
            job = next((j for j in self.pending if j.request_id == rid), None)
            if job is not None:
                self.pending.remove(job)
            elif rid in self.active:
                job = self.active.pop(rid)
                self.engine.abort(rid)
            if job is not None and self.metrics:  # counted before anyone can see it gone
                self.metrics.aborted.inc()
        if job is not None:
            self._release(rid)
            if self.tracer is not None:
                self.tracer.record(job, None, "abort", time.monotonic())

    def _expire_pending(self) -> None:
        now = time.monotonic()
        with self._cond:
            late = [j for j in self.pending if j.deadline is not None and now > j.deadline]
            for j in late:
                self.pending.remove(j)
        for j in late:
            if j.estimate_s:
                self.admission.observe_ttft(now - j.arrival, j.estimate_s)
            self._release(j.request_id)
            if self.tracer is not None:
                self.tracer.record(j, None, "deadline", now)
            j.sink("deadline", None)
            if self.metrics:
                self.metrics.deadline.inc()

    def _admit_some(self) -> None:
        """Move pending jobs into the engine, encoding at most about one encoder budget of
        image tokens per step so running decodes keep flowing between encoder batches."""
        with self._cond:
            batch: list[Job] = []
            budget = self.encoder_tokens_per_step
            room = self.cache.max_bytes - self.cache.pinned_bytes
            for job in list(self.pending):
                if job.prepared is not None and job.prepared.images:
                    need = job.encode_tokens
                    nbytes = job.prepared.cache_bytes
                    if (batch and need > budget) or nbytes > room:
                        break  # keep EDF order: later jobs wait behind this one
                    budget -= need
                    room -= nbytes
                batch.append(job)
                self.pending.remove(job)
        embeds = self._encode(batch)
        for job in batch:
            if job.failed:
                continue
            try:
                mm = (job.front.mm_inputs(job.prepared, embeds, owner=job.request_id)
                      if job.prepared is not None else None)
                self.engine.add_request(job.request_id, prompt_token_ids=job.prompt_token_ids,
                                        sampling_params=job.sampling_params, mm_inputs=mm,
                                        deadline=job.deadline, priority=job.priority,
                                        graft=job.graft,
                                        kv_export=job.kv_export, kv_import=job.kv_import)
            except Exception as err:  # noqa: BLE001 - this job's failure, nobody else's
                self._fail_job(job, err)
                continue
            with self._cond:  # `active` is read by submit() and the metrics on other threads
                self.active[job.request_id] = job

    def _encode(self, batch: list[Job]) -> dict:
        """Embeddings for the batch's images, one encoder call per graft; when a call fails,
        each of its jobs is encoded alone so only the job whose image fails is failed."""
        embeds: dict = {}
        by_front: dict[int, tuple] = {}  # one encoder batch per graft
        for j in batch:
            if j.prepared is not None and j.prepared.images:
                by_front.setdefault(id(j.front), (j.front, []))[1].append(j)
        for front, jobs in by_front.values():
            groups = [jobs]
            while groups:
                group = groups.pop()
                items = [(im, j.request_id) for j in group for im in j.images_to_encode()]
                start = time.perf_counter()
                try:
                    got, encoded = front.encode(items)
                except Exception as err:  # noqa: BLE001
                    if len(group) == 1:
                        self._fail_job(group[0], err)
                    else:
                        groups += [[j] for j in group]
                    continue
                embeds.update(got)  # keys carry encoder + adapter identity: no clashes
                self.cost.observe_encode(encoded, time.perf_counter() - start)
        return embeds

    def _fail_job(self, job: Job, err: Exception) -> None:
        """A job that failed before entering the engine: error to its client, pins freed."""
        job.failed = True
        self._release(job.request_id)
        if isinstance(err, GraftError):  # a domain refusal: the message is for the client
            job.sink("error", APIError(str(err), param=job.prompt_param(), code="invalid_prompt"))
        else:
            log.error("request %r failed before the engine", job.request_id, exc_info=err)
            job.sink("error", internal_error())

    def _deliver(self, out) -> None:
        job = self.active.get(out.request_id)
        if job is None:
            return
        now = time.monotonic()
        if job.first_token_at is None and (out.token_ids or out.embedding is not None):
            job.first_token_at = now
            # The budget is for the first token; once met, decoding runs to its own end.
            self.engine.clear_deadline(job.request_id)
            if self.metrics:
                self.metrics.prompt_tokens.inc(len(job.prompt_token_ids))  # prefilled now
                self.metrics.ttft.observe(now - job.arrival)
                if job.estimate_s:
                    self.metrics.ttft_vs_estimate.observe((now - job.arrival) / job.estimate_s)
                per_graft = self.metrics.grafts.get(job.graft)
                if per_graft is not None:
                    per_graft.ttft.observe(now - job.arrival)
            if job.estimate_s:
                self.admission.observe_ttft(now - job.arrival, job.estimate_s)
        if out.finished and job.first_token_at is None and job.estimate_s:
            # stopped without a first token (deadline): its elapsed time is a lower bound
            self.admission.observe_ttft(now - job.arrival, job.estimate_s)
        if len(out.token_ids) > job.n_output:
            if self.metrics and job.last_output_at is not None:
                self.metrics.token_gap(now - job.last_output_at)
            job.last_output_at = now
        if self.metrics:  # counted as they come: a rate over an interval follows the stream
            self.metrics.generation_tokens.inc(len(out.token_ids) - job.n_output)
        job.n_output = len(out.token_ids)
        if out.finished:  # bookkeeping first: a client holding its answer sees it counted
            with self._cond:
                self.active.pop(out.request_id, None)
            self._release(out.request_id)
            if self.metrics:
                self._record_finish(job, out, now)
            if self.tracer is not None:
                self.tracer.record(job, out, _STATUS.get(out.finish_reason, "ok"), now)
        error = finish_error(job, out)
        job.sink(*(("output", out) if error is None else ("error", error)))

    def _record_finish(self, job: Job, out, now: float) -> None:
        m = self.metrics
        m.request_finished(out.finish_reason)
        m.e2e.observe(now - job.arrival)
        if job.first_token_at is not None and job.n_output > 1:
            m.tpot.observe((now - job.first_token_at) / (job.n_output - 1))
        if out.finish_reason == "deadline":
            m.deadline.inc()

    def _release(self, rid: str) -> None:
        self.cache.release(rid)

    def _fail_all(self, err: APIError) -> None:
        with self._cond:
            jobs = list(self.pending) + list(self.active.values())
            running = set(self.active)
            self.pending.clear()
            self.active.clear()
        for job in jobs:
            if job.request_id in running:
                try:
                    self.engine.abort(job.request_id)
                except Exception:  # the engine is already in trouble; free what we can
                    log.exception("abort after engine error failed")
            self._release(job.request_id)
            job.sink("error", err)


def _settle(future: asyncio.Future, result, error) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


# a finish reason -> the trace's status (stop, length: ok)
_STATUS = {"deadline": "deadline", "abort": "abort", "error": "error", "internal_error": "error"}

