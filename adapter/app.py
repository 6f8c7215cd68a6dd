"""The HTTP surface: OpenAI-compatible endpoints over supervised Reflex engines (adapter/supervisor.py).

Every error has OpenAI's shape {"error": {"message", "type", "param", "code"}} and status:
400 invalid, 401 bad key, 404 unknown model, 413 too large, 429 queue full, 503 engine
unavailable (starting, restarting, or busy past the wait), 500 internal."""
from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from adapter.ipc_client import EngineError, EngineGone
from adapter.schemas import (ChatRequest, ClassifyRequest, EmbeddingRequest, SystemOneRequest)
from adapter.supervisor import EngineSlot, QueueFull, Unavailable


@dataclass
class Config:
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    max_prompt_chars: int = 200_000
    slots: dict = field(default_factory=dict)     # served model name -> EngineSlot
    # retrieval: served alias -> (index name, chat slot name); the embedding slot; indexes dir
    rag_aliases: dict = field(default_factory=dict)
    rag_embed: str | None = None
    indexes_dir: str | None = None
    rag_top_k: int = 4


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


# engine error category -> (HTTP status, OpenAI type, code)
_CATEGORY = {
    "invalid_request": (400, "invalid_request_error", None),
    "context_overflow": (400, "invalid_request_error", "context_length_exceeded"),
    "model_not_found": (404, "invalid_request_error", "model_not_found"),
    "busy": (503, "server_error", "engine_busy"),
    "out_of_memory": (503, "server_error", "out_of_memory"),
}


def from_engine(e: EngineError) -> APIError:
    status, type_, code = _CATEGORY.get(e.category, (500, "server_error", e.category))
    return APIError(status, e.message, type_, code=code)


def unavailable(msg: str) -> APIError:
    return APIError(503, msg, "server_error", code="engine_unavailable", headers={"Retry-After": "1"})


# ------------------------------------------------------------------ engine calls
_DONE = object()


def _start(slot: EngineSlot, op: str, params: dict) -> queue.Queue:
    """Run one request on `slot` in a worker thread that owns the engine until the request ends,
    even if the HTTP client goes away (the engine is drained, never left mid-answer).
    Queue items: event dicts, then _DONE; or an EngineGone instance."""
    try:
        client = slot.acquire()
    except QueueFull as e:
        raise APIError(429, str(e), "rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
    except Unavailable as e:
        raise unavailable(str(e))
    q: queue.Queue = queue.Queue()

    def work():
        try:
            for ev in client.request(op, **params):
                q.put(ev)
            q.put(_DONE)
        except EngineGone as e:
            slot.broken(str(e))
            q.put(e)
        except Exception as e:  # never leave the reader waiting
            q.put(EngineGone(f"{type(e).__name__}: {e}"))
        finally:
            slot.release()

    threading.Thread(target=work, daemon=True).start()
    return q


def _died(slot: EngineSlot, e: EngineGone) -> APIError:
    return APIError(503, f"engine {slot.name} died during the request ({e}); it is restarting, "
                    f"retry shortly", "server_error", code="engine_died", headers={"Retry-After": "1"})


def call(slot: EngineSlot, op: str, **params) -> dict:
    q = _start(slot, op, params)
    last = None
    while True:
        item = q.get()
        if item is _DONE:
            break
        if isinstance(item, EngineGone):
            raise _died(slot, item)
        last = item
    if last["event"] == "error":
        err = last.get("error") or {}
        raise from_engine(EngineError(err.get("category", "internal"), err.get("message", "")))
    return last["result"]


# ------------------------------------------------------------------ helpers
def _messages(req: ChatRequest) -> list:
    out = []
    for i, m in enumerate(req.messages):
        c = m.content
        if isinstance(c, list):
            texts = []
            for part in c:
                if part.type != "text" or part.text is None:
                    raise APIError(400, f"messages[{i}]: only text content parts are supported, "
                                   f"got {part.type!r}", param=f"messages.{i}.content")
                texts.append(part.text)
            c = "".join(texts)
        role = "system" if m.role == "developer" else m.role
        out.append({"role": role, "content": c or ""})
    return out


def _refuse_unsupported(req: ChatRequest):
    if req.n not in (None, 1):
        raise APIError(400, "only n=1 is supported (one request, one answer)", param="n")
    if req.logprobs:
        raise APIError(400, "logprobs are not supported", param="logprobs")
    if req.tools:
        raise APIError(400, "tools are not supported", param="tools")
    if req.response_format and req.response_format.get("type", "text") != "text":
        raise APIError(400, "only response_format type 'text' is supported", param="response_format")
    for k in ("frequency_penalty", "presence_penalty"):
        if getattr(req, k):
            raise APIError(400, f"{k} is not supported (use the repeat_penalty extension)", param=k)


def _gen_params(req: ChatRequest, slot: EngineSlot) -> dict:
    p = {"max_tokens": req.max_completion_tokens or req.max_tokens or
         int(slot.info.get("n_ctx") or 4096)}  # default: until the end or the context edge
    # OpenAI's defaults (temperature 1, top_p 1), no top-k / min-p cut unless asked for
    p["temperature"] = float(1.0 if req.temperature is None else req.temperature)
    p["top_p"] = float(1.0 if req.top_p is None else req.top_p)
    p["top_k"] = 0 if req.top_k is None else req.top_k
    p["min_p"] = 0.0 if req.min_p is None else float(req.min_p)
    if req.repeat_penalty is not None:
        p["repeat_penalty"] = float(req.repeat_penalty)
    if req.seed is not None:
        if req.seed < 0:
            raise APIError(400, "seed must be >= 0", param="seed")
        p["seed"] = req.seed
    if req.stop is not None:
        p["stop"] = [req.stop] if isinstance(req.stop, str) else req.stop
    return p


def _usage(u: dict) -> dict:
    return {"prompt_tokens": u.get("prompt_tokens", 0), "completion_tokens": u.get("completion_tokens", 0),
            "total_tokens": u.get("total_tokens", 0)}


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


# ------------------------------------------------------------------ the app
def create_app(cfg: Config, manage_engines: bool = True) -> FastAPI:
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        if manage_engines:
            for s in cfg.slots.values():
                s.start()
        yield
        if manage_engines:
            for s in cfg.slots.values():
                s.stop()

    app = FastAPI(title="reflex-adapter", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible HTTP over Reflex engines (local IPC)")

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        n = request.headers.get("content-length")
        if n is not None and n.isdigit() and int(n) > cfg.max_body_bytes:
            e = APIError(413, f"request body is {n} bytes; the limit is {cfg.max_body_bytes}",
                         code="request_too_large")
            return JSONResponse(e.body(), status_code=413)
        if n is None and request.method == "POST":
            body = b""
            async for chunk in request.stream():
                body += chunk
                if len(body) > cfg.max_body_bytes:
                    e = APIError(413, f"request body exceeds {cfg.max_body_bytes} bytes",
                                 code="request_too_large")
                    return JSONResponse(e.body(), status_code=413)
            request._body = body  # let the route read it again
        return await call_next(request)

    @app.exception_handler(APIError)
    async def on_api_error(request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request, e: RequestValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return JSONResponse(APIError(400, f"malformed JSON body: {first.get('ctx', {}).get('error', '')}"
                                         .rstrip(": "), code="invalid_json").body(), status_code=400)
        # drop pydantic's union-member tags (e.g. "str", "list[ContentPart]") from the field path
        tags = {"str", "int", "float", "bool", "none", "dict"}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"
               and not (isinstance(x, str) and (x in tags or "[" in x or "-" in x))]
        param = ".".join(loc) or None
        msg = f"{param}: {first.get('msg')}" if param else str(first.get("msg", "invalid request"))
        return JSONResponse(APIError(400, msg, param=param).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request, e: StarletteHTTPException):
        type_ = "invalid_request_error" if e.status_code < 500 else "server_error"
        return JSONResponse(APIError(e.status_code, str(e.detail), type_).body(), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def on_any(request, e: Exception):
        return JSONResponse(APIError(500, f"internal error: {type(e).__name__}: {e}", "server_error").body(),
                            status_code=500)

    def auth(request: Request):
        if cfg.api_key is None:
            return
        h = request.headers.get("authorization", "")
        if h != f"Bearer {cfg.api_key}":
            raise APIError(401, "invalid or missing API key (Authorization: Bearer ...)",
                           code="invalid_api_key")

    def slot_for(name: str) -> EngineSlot:
        s = cfg.slots.get(name)
        if s is None:
            raise APIError(404, f"the model {name!r} does not exist (served: "
                           f"{', '.join(cfg.slots) or 'none'})", param="model", code="model_not_found")
        return s

    v1 = [Depends(auth)]

    @app.get("/health")
    def health():
        engines = {n: s.status() for n, s in cfg.slots.items()}
        ok = all(e["state"] == "ready" for e in engines.values())
        return JSONResponse({"status": "ok" if ok else "unavailable", "engines": engines},
                            status_code=200 if ok else 503)

    @app.get("/ping")
    def ping():
        """Runpod load-balancer health: 200 when every engine is ready, 204 while starting."""
        from fastapi import Response

        if all(s.state == "ready" for s in cfg.slots.values()):
            return JSONResponse({"status": "healthy"})
        return Response(status_code=204)

    @app.get("/v1/models", dependencies=v1)
    def models():
        return {"object": "list", "data": [{"id": n, "object": "model", "created": 0,
                                            "owned_by": "reflex"}
                                           for n in list(cfg.slots) + list(cfg.rag_aliases)]}

    retriever = {}

    def get_retriever():
        if "r" not in retriever:
            from adapter.retrieval import IPCEmbedder, Retriever
            if cfg.rag_embed is None or cfg.rag_embed not in cfg.slots:
                raise APIError(400, "retrieval needs an embedding engine (--rag-embed)", param="retrieval")
            retriever["r"] = Retriever(cfg.indexes_dir, IPCEmbedder(cfg.slots[cfg.rag_embed], call))
        return retriever["r"]

    def retrieve(index: str, k: int, msgs: list):
        """-> (question, hits at or above the score threshold). Only the last user message is the
        question; earlier turns are not sent (the sources are the context)."""
        from adapter.retrieval import messages_for
        from reflex.errors import ReflexError

        question = next((m["content"] for m in reversed(msgs) if m["role"] == "user"), "")
        try:
            hits, _ = get_retriever().search(index, question, k)
        except ReflexError as e:
            raise from_engine(EngineError(e.category, str(e)))
        return question, hits

    def _start_first(slot, msgs, params, hits, rebuild):
        """Start the chat; on context_overflow shed the weakest source and retry."""
        while True:
            q = _start(slot, "chat", {"messages": msgs, **params})
            first = q.get()  # the first event decides the status: an error here is a plain HTTP error
            if isinstance(first, EngineGone):
                raise _died(slot, first)
            if first is not _DONE and first["event"] == "error":
                err = first.get("error") or {}
                if err.get("category") == "context_overflow" and hits and len(hits) > 1:
                    while q.get() is not _DONE:
                        pass
                    hits = hits[:-1]
                    msgs = rebuild(hits)
                    continue
                raise from_engine(EngineError(err.get("category", "internal"), err.get("message", "")))
            return q, first, hits

    @app.post("/v1/chat/completions", dependencies=v1)
    def chat_completions(req: ChatRequest):
        from adapter.retrieval import messages_for, sources_of

        index, k = None, cfg.rag_top_k
        if req.model in cfg.rag_aliases:
            index, chat_name = cfg.rag_aliases[req.model]
            slot = slot_for(chat_name)
        else:
            slot = slot_for(req.model)
        if req.retrieval is not None:
            index, k = req.retrieval.index, req.retrieval.top_k
        _refuse_unsupported(req)
        msgs = _messages(req)
        n_chars = sum(len(m["content"]) for m in msgs)
        if n_chars > cfg.max_prompt_chars:
            raise APIError(413, f"prompt is {n_chars} characters; the limit is {cfg.max_prompt_chars}",
                           param="messages", code="prompt_too_large")
        params = _gen_params(req, slot)
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        hits, extra, body = None, {}, None
        rebuild = None
        if index is not None:
            question, hits = retrieve(index, k, msgs)
            rebuild = lambda h: messages_for(question, h)  # noqa: E731
            if not hits:  # nothing relevant: say so rather than answer from nothing
                text = (f"I found nothing relevant to this question in index {index!r}, so I cannot "
                        f"answer it from these documents.")
                body = {"id": cid, "object": "chat.completion", "created": created, "model": req.model,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                     "logprobs": None, "finish_reason": "stop"}],
                        "usage": _usage({}), "sources": []}
                if not req.stream:
                    return body
                msgs = None
            else:
                msgs = rebuild(hits)
        if msgs is None:
            q, first, hits = None, _DONE, []
        else:
            q, first, hits = _start_first(slot, msgs, {"stream": req.stream, **params}, hits, rebuild)
        if hits is not None:
            extra = {"sources": sources_of(hits)}
        if not req.stream:
            last = first
            while last is not _DONE:
                item = q.get()
                if isinstance(item, EngineGone):
                    raise _died(slot, item)
                if item is _DONE:
                    break
                last = item
            if last["event"] == "error":
                err = last.get("error") or {}
                raise from_engine(EngineError(err.get("category", "internal"), err.get("message", "")))
            r = last["result"]
            return {"id": cid, "object": "chat.completion", "created": created, "model": req.model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": r["text"]},
                                 "logprobs": None, "finish_reason": r["finish_reason"]}],
                    "usage": _usage(r["usage"]), "timings": r.get("timings"), **extra}
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(delta, finish=None, **extra):
            return {"id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": req.model, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                     "finish_reason": finish}], **extra}

        def events():
            yield _sse(chunk({"role": "assistant", "content": ""}, **extra))
            if q is None:  # retrieval found nothing: the fixed answer, streamed as one piece
                yield _sse(chunk({"content": body["choices"][0]["message"]["content"]}))
                yield _sse(chunk({}, "stop"))
                yield b"data: [DONE]\n\n"
                return
            item = first
            while True:
                if isinstance(item, EngineGone):
                    e = _died(slot, item)
                    yield _sse({"error": e.body()["error"]})
                    return
                if item is _DONE:
                    break
                ev = item["event"]
                if ev == "token":
                    yield _sse(chunk({"content": item["text"]}))
                elif ev == "result":
                    r = item["result"]
                    yield _sse(chunk({}, r["finish_reason"]))
                    if include_usage:
                        yield _sse({"id": cid, "object": "chat.completion.chunk", "created": created,
                                    "model": req.model, "choices": [], "usage": _usage(r["usage"])})
                elif ev == "error":
                    e = from_engine(EngineError(item["error"].get("category", "internal"),
                                                item["error"].get("message", "")))
                    yield _sse({"error": e.body()["error"]})
                    return
                item = q.get()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    @app.post("/v1/embeddings", dependencies=v1)
    def embeddings(req: EmbeddingRequest):
        slot = slot_for(req.model)
        inp = req.input
        if inp == [] or inp == "" or (isinstance(inp, list) and any(x in ("", []) for x in inp)):
            raise APIError(400, "input must not be empty", param="input")
        n_embd = slot.info.get("n_embd")
        if req.dimensions is not None and req.dimensions != n_embd:
            raise APIError(400, f"dimensions={req.dimensions} is not available for {req.model}: "
                           f"its embeddings have {n_embd} dimensions", param="dimensions")
        n_chars = len(inp) if isinstance(inp, str) else sum(len(x) if isinstance(x, (str, list)) else 1
                                                             for x in inp)
        if n_chars > cfg.max_prompt_chars:
            raise APIError(413, f"input is {n_chars} characters/tokens; the limit is {cfg.max_prompt_chars}",
                           param="input", code="input_too_large")
        r = call(slot, "embed", input=inp, encoding_format=req.encoding_format)
        return {"object": "list", "model": req.model,
                "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(r["data"])],
                "usage": {"prompt_tokens": r["usage"]["prompt_tokens"],
                          "total_tokens": r["usage"]["total_tokens"]}}

    @app.post("/v1/classify", dependencies=v1)
    def classify(req: ClassifyRequest):
        slot = slot_for(req.model)
        if len(req.text) > cfg.max_prompt_chars:
            raise APIError(413, f"text is {len(req.text)} characters; the limit is {cfg.max_prompt_chars}",
                           param="text", code="input_too_large")
        params = {"text": req.text, "labels": req.labels, "normalize": req.normalize, "chat": req.chat}
        if req.template is not None:
            params["template"] = req.template
        r = call(slot, "classify", **params)
        return {"object": "classification", "model": req.model, **r}

    @app.post("/v1/systemone", dependencies=v1)
    def systemone(req: SystemOneRequest):
        slot = slot_for(req.model)
        n = (len(req.context) if isinstance(req.context, (str, list)) else 0) + \
            sum(len(c) for c in req.candidates)
        if n > cfg.max_prompt_chars:
            raise APIError(413, f"context + candidates are {n} characters; the limit is "
                           f"{cfg.max_prompt_chars}", param="candidates", code="input_too_large")
        r = call(slot, "score", context=req.context, candidates=req.candidates, normalize=req.normalize)
        return {"object": "systemone", "model": req.model, **r}

    return app
