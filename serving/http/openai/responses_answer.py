"""POST /v1/responses, the answer side: a chat answer (chat_answer.ChatAnswer's body, or its
stream's chunk bodies) as OpenAI's Response object, or as the Responses stream's events
(response.created ... response.completed). Output items: the thinking (with
--reasoning-parser) as a `reasoning` item, the text as a `message` item with one
`output_text` part, each tool call as a `function_call` item, in the order they came."""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from graft.serving.http.openai import response_bodies as R
from graft.serving.http.openai.responses import Progress, chunks, complete, watch_disconnect
from graft.serving.http.openai.responses_store import as_input


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def response_object(req, rid: str, created: int, output: list[dict], status: str,
                    usage: dict | None) -> dict[str, Any]:
    """A Response (OpenAI's fields; the request's settings echoed back)."""
    body = req._body
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    fmt = (body.text or {}).get("format") or {"type": "text"}
    return {
        "id": rid, "object": "response", "created_at": created, "status": status,
        "error": None, "incomplete_details": incomplete, "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens, "model": req.model, "output": output,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id, "reasoning": None,
        "store": req._store is not None,
        "temperature": body.temperature, "text": {"format": fmt},
        "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
        "top_p": body.top_p, "truncation": "disabled", "metadata": body.metadata or {},
        "usage": usage, "user": None}


def usage_of(chat_usage: dict) -> dict[str, Any]:
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens":
                                     chat_usage["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["total_tokens"]}


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason in ("length", "deadline") else "completed"


def from_chat(req, chat: dict) -> dict[str, Any]:
    """The Response of a whole chat answer (ChatAnswer.whole's body)."""
    choice = chat["choices"][0]
    message = choice["message"]
    output = []
    if message.get("reasoning"):
        output.append(_reasoning_item(_id("rs"), message["reasoning"]))
    if message.get("content") or not (message.get("tool_calls") or output):
        output.append(_message_item(_id("msg"), message.get("content") or "",
                                    _logprobs(choice.get("logprobs"))))
    for call in message.get("tool_calls") or ():
        output.append(_call_item(call["id"], call["function"]["name"],
                                 call["function"]["arguments"]))
    return kept(req, response_object(req, _id("resp"), chat["created"], output,
                                     _status(choice["finish_reason"]), usage_of(chat["usage"])))


def kept(req, response: dict) -> dict:
    """`response`, kept for a previous_response_id that continues it when the request asks."""
    if req._store is not None:
        req._store.put(response, req._conversation + as_input(response["output"]))
    return response


def _message_item(item_id: str, text: str, logprobs: list | None = None,
                  status: str = "completed") -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    return {"type": "message", "id": item_id, "role": "assistant", "status": status,
            "content": [part]}


def _reasoning_item(item_id: str, text: str) -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def _call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"type": "function_call", "id": "fc_" + call_id.removeprefix("call_"),
            "call_id": call_id, "name": name, "arguments": arguments, "status": status}


def _logprobs(chat_logprobs: dict | None) -> list:
    """Chat's logprobs as output_text's: the same per-token entries."""
    return chat_logprobs["content"] if chat_logprobs else []


class EventWriter:
    """The Responses stream's events for one answer, fed its chat chunk bodies in order."""

    def __init__(self, req):
        self.req = req
        self.rid = _id("resp")
        self.created = int(time.time())
        self.seq = 0
        self.output: list[dict] = []  # items so far, the open one last
        self.open: str | None = None  # "reasoning" | "message" | "call": the item being written

    def _event(self, kind: str, **fields) -> dict:
        # a snapshot: the items in it go on growing after the event is made
        event = copy.deepcopy({"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1
        return event

    def _response(self, status: str, usage: dict | None = None) -> dict:
        return response_object(self.req, self.rid, self.created, self.output, status, usage)

    def start(self) -> list[dict]:
        return [self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress"))]

    def chunk(self, body: dict) -> list[dict]:
        events = []
        for choice in body.get("choices", ()):
            delta = choice.get("delta") or {}
            if delta.get("reasoning"):
                events += self._text("reasoning", delta["reasoning"])
            logprobs = _logprobs(choice.get("logprobs"))
            if delta.get("content") or ("content" in delta and logprobs):  # (held-back text's
                events += self._text("message", delta["content"] or "", logprobs)  # logprobs)
            for part in delta.get("tool_calls") or ():
                events += self._call(part)
        return events

    def finish(self, finish_reason: str | None, chat_usage: dict) -> list[dict]:
        events = self._close()
        if not self.output:  # nothing was said: still one (empty) message, as from_chat
            events += self._text("message", "") + self._close()
        status = _status(finish_reason)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        response = kept(self.req, self._response(status, usage_of(chat_usage)))
        return events + [self._event(kind, response=response)]

    def error(self, error: dict) -> dict:
        """The stream's `error` event (a refusal or failure mid-answer)."""
        return self._event("error", code=error.get("code"), message=error.get("message"),
                           param=error.get("param"))

    def _at(self) -> dict:
        return {"output_index": len(self.output) - 1, "item_id": self.output[-1]["id"]}

    def _text(self, kind: str, text: str, logprobs: list | None = None) -> list[dict]:
        events = []
        if self.open != kind:
            events += self._close()
            item = (_reasoning_item(_id("rs"), "") if kind == "reasoning"
                    else _message_item(_id("msg"), "", status="in_progress"))
            self.output.append(item)
            self.open = kind
            events.append(self._event("response.output_item.added",
                                      output_index=len(self.output) - 1,
                                      item=item))
            events.append(self._event("response.content_part.added", **self._at(),
                                      content_index=0, part=item["content"][0]))
        part = self.output[-1]["content"][0]
        part["text"] += text
        if kind == "message":
            part["logprobs"] += logprobs or []
            return events + [self._event("response.output_text.delta", **self._at(),
                                         content_index=0, delta=text, logprobs=logprobs or [])]
        return events + [self._event("response.reasoning_text.delta", **self._at(),
                                     content_index=0, delta=text)]

    def _call(self, part: dict) -> list[dict]:
        events = []
        if "id" in part:  # a new call: its name comes first, the arguments after
            events += self._close()
            item = _call_item(part["id"], part["function"]["name"], "", status="in_progress")
            self.output.append(item)
            self.open = "call"
            events.append(self._event("response.output_item.added",
                                      output_index=len(self.output) - 1, item=item))
        arguments = part["function"].get("arguments") or ""
        if arguments:
            self.output[-1]["arguments"] += arguments
            events.append(self._event("response.function_call_arguments.delta", **self._at(),
                                      delta=arguments))
        return events

    def _close(self) -> list[dict]:
        """The done events of the open item, if any."""
        kind, self.open = self.open, None
        if kind is None:
            return []
        item, at = self.output[-1], self._at()
        events = []
        if kind == "call":
            events.append(self._event("response.function_call_arguments.done", **at,
                                      arguments=item["arguments"], name=item["name"]))
        else:
            part = item["content"][0]
            text_done = ("response.output_text.done" if kind == "message"
                         else "response.reasoning_text.done")
            events.append(self._event(text_done, **at, content_index=0, text=part["text"],
                                      **({"logprobs": part["logprobs"]} if kind == "message"
                                         else {})))
            events.append(self._event("response.content_part.done", **at, content_index=0,
                                      part=part))
        if "status" in item:
            item["status"] = "completed"
        events.append(self._event("response.output_item.done", output_index=at["output_index"],
                                  item=item))
        return events


def sse_event(event: dict) -> bytes:
    """One Responses stream event: its type on the `event:` line, as OpenAI sends them."""
    return f"event: {event['type']}\n".encode() + R.sse(event)


async def answer(ctx, request: Request, job, queue, shape, req) -> Response:
    """The Response of a submitted chat job (`shape` a ChatAnswer, `req` the ResponsesChat):
    one JSON object, or the stream of events."""
    if not req.stream:
        return await complete(ctx, job, queue, request, shape, lambda chat: from_chat(req, chat))
    watcher = watch_disconnect(request, lambda: ctx.worker.abort(job.request_id))
    return StreamingResponse(_events(ctx, job, queue, shape, req, watcher),
                             media_type="text/event-stream")


async def _events(ctx, job, queue, shape, req, watcher):
    progress, writer, reason = Progress(), EventWriter(req), None
    try:
        for event in writer.start():
            yield sse_event(event)
        async for body in chunks(ctx, job, queue, shape, None, progress):
            if "error" in body:  # the stream's own error event, then it ends
                yield sse_event(writer.error(body["error"]))
                return
            for event in writer.chunk(body):
                yield sse_event(event)
            for choice in body.get("choices", ()):
                reason = choice.get("finish_reason") or reason
        usage = R.usage(*shape.counts(progress.last), progress.last)
        for event in writer.finish(reason, usage):
            yield sse_event(event)
    finally:
        watcher.cancel()
        if not progress.done:  # client went away mid-stream: free its KV blocks
            ctx.worker.abort(job.request_id)
