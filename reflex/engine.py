"""High-level text generation: load a GGUF model once, then generate / chat.

    eng = Engine("smollm2")
    r = eng.generate("The capital of France is", max_tokens=16, temperature=0)
    r.text, r.finish_reason, r.usage, r.timings
    for piece in eng.generate("Hi", stream=True): print(piece, end="")
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

from reflex.errors import ContextOverflow, InvalidRequest
from reflex.sampling import Sampler

DEFAULT_CTX = 4096
_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed")


@dataclass
class GenerationResult:
    text: str
    tokens: list
    finish_reason: str                       # "stop" | "length"
    usage: dict = field(default_factory=dict)    # prompt_tokens, completion_tokens
    timings: dict = field(default_factory=dict)  # load_s, prefill_s, prefill_tok_s, decode_s, ...
    prompt_ids: list = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("prompt_ids", None)
        return d

    def __getitem__(self, k):  # dict-style access too
        return getattr(self, k)


class GenerationStream:
    """Iterator of text pieces; `.result` holds the GenerationResult once exhausted."""

    def __init__(self, gen):
        self._gen = gen
        self.result: GenerationResult | None = None

    def __iter__(self):
        return self

    def __next__(self) -> str:
        try:
            return next(self._gen)
        except StopIteration as e:
            self.result = e.value
            raise StopIteration

    def close(self):
        self._gen.close()


class _StopMatcher:
    """Holds back text that might be the beginning of a stop string; finds stops across pieces."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.hit = False

    def push(self, s: str) -> str:
        if not self.stops:
            return s
        self.pending += s
        best = -1
        for st in self.stops:
            i = self.pending.find(st)
            if i >= 0 and (best < 0 or i < best):
                best = i
        if best >= 0:
            self.hit = True
            out, self.pending = self.pending[:best], ""
            return out
        # longest suffix of pending that is a prefix of some stop string
        hold = 0
        for st in self.stops:
            for k in range(min(len(st) - 1, len(self.pending)), hold, -1):
                if self.pending.endswith(st[:k]):
                    hold = k
                    break
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold:]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class Engine:
    def __init__(self, model: str = "smollm2", n_ctx: int | None = None, backend: str = "numpy"):
        from reflex.chat_template import ChatTemplate
        from reflex.gguf import GGUFFile
        from reflex.models import load_model
        from reflex.store import resolve
        from reflex.tokenizer import Tokenizer

        t0 = time.perf_counter()
        if backend in ("cuda", "gpu"):
            # CUDA context creation runs on a thread (driver calls release the GIL) while the file
            # is mapped and the tokenizer built; load_model waits for it
            from reflex.backends import cuda_driver
            cuda_driver.start()
        self.path = resolve(model)
        self.gguf = GGUFFile(self.path)
        t1 = time.perf_counter()
        if backend in ("cuda", "gpu") and os.environ.get("REFLEX_CUDA_PREFETCH", "1") != "0":
            # the weights' one host->device copy starts now, on a thread, and overlaps the
            # tokenizer and the model set-up below (cuda_driver.prefetch; =0 turns it off)
            cuda_driver.prefetch(self.gguf)
        try:
            self.tokenizer = Tokenizer.from_gguf(self.gguf)
            t2 = time.perf_counter()
            try:
                self.template = ChatTemplate.from_metadata(self.gguf.metadata)
            except Exception:  # a model without a usable template can still generate
                self.template = None
            self.model = load_model(self.gguf, backend)
        except BaseException:
            if backend in ("cuda", "gpu"):
                cuda_driver.discard_prefetch(self.gguf)
            self.gguf.close()
            raise
        t3 = time.perf_counter()
        train_ctx = int(getattr(self.model.hp, "n_ctx_train", DEFAULT_CTX) or DEFAULT_CTX)
        if n_ctx is None:
            n_ctx = min(train_ctx, DEFAULT_CTX)
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx <= 0:
            raise InvalidRequest(f"n_ctx must be a positive integer, got {n_ctx!r}")
        self.n_ctx = n_ctx
        self.load_timings = {"open_s": t1 - t0, "tokenizer_s": t2 - t1, "model_s": t3 - t2,
                             "load_s": t3 - t0}

    def close(self):
        """Release the model file (the Engine is unusable afterwards)."""
        self.model = None
        self.gguf.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def memory(self) -> dict:
        """What this engine holds: the GGUF's tensor bytes (memory-mapped, paged in on use) and the
        backend's resident weight bytes (float32 copies on NumPy; the GGUF blocks on CUDA), plus
        whatever else the backend reports (process RSS, GPU allocations)."""
        d = {"gguf_tensor_bytes": int(sum(t.nbytes for t in self.gguf.tensors.values()))}
        mem = getattr(self.model.backend, "memory", None) if self.model is not None else None
        if mem is not None:
            d.update(mem())
        return d

    @property
    def load_s(self) -> float:
        return self.load_timings["load_s"]

    # ---------------------------------------------------------------- public API
    def generate(self, prompt, max_tokens: int = 128, stop=None, stream: bool = False,
                 parse_special: bool = False, **sampling):
        """Generate from a text prompt (or a list of token ids, used as is)."""
        ids = self._prepare(prompt, parse_special)
        return self._run(ids, max_tokens, stop, stream, sampling)

    def chat(self, messages, max_tokens: int = 128, stop=None, stream: bool = False, **sampling):
        if self.template is None:
            raise InvalidRequest("model has no chat template")
        text = self.template.render(messages, add_generation_prompt=True)
        return self.generate(text, max_tokens=max_tokens, stop=stop, stream=stream,
                             parse_special=True, **sampling)

    def score(self, context, candidates, normalize: bool = False, parse_special: bool = False):
        """system1: log-probs of candidate continuations in one forward (reflex/system1.py)."""
        from reflex.system1 import score

        return score(self.model, self.tokenizer, context, candidates, normalize=normalize,
                     n_ctx=self.n_ctx, parse_special=parse_special)

    def classify(self, text, labels=None, template=None, normalize: bool = False, chat: bool = False):
        """Probability per label via system1 or the model's classifier head (reflex/classify.py)."""
        from reflex.classify import classify

        return classify(self, text, labels, template=template, normalize=normalize, chat=chat)

    def embed(self, texts, normalize: bool = True, truncate: bool = False):
        """Embeddings (reflex/embed.py): (N, n_embd) float32 for a list, (n_embd,) for one string."""
        from reflex.embed import embed

        v, _ = embed(self.model, self.tokenizer, texts, normalize=normalize, truncate=truncate,
                     n_ctx=self.n_ctx, metadata=self.gguf.metadata)
        return v[0] if isinstance(texts, str) else v

    # ---------------------------------------------------------------- internals
    def _prepare(self, prompt, parse_special: bool) -> list:
        if isinstance(prompt, str):
            if prompt == "":
                raise InvalidRequest("prompt is empty")
            ids = self.tokenizer.encode(prompt, add_special=True, parse_special=parse_special)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool)
                                                       for i in prompt):
            ids = list(prompt)
        else:
            raise InvalidRequest("prompt must be a string or a list of token ids")
        if not ids:
            raise InvalidRequest("prompt is empty")
        return ids

    def _run(self, ids, max_tokens, stop, stream, sampling):
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be a positive integer, got {max_tokens!r}")
        unknown = set(sampling) - set(_SAMPLING_KEYS)
        if unknown:
            raise InvalidRequest(f"unknown generation parameter(s): {', '.join(sorted(unknown))}")
        sampler = Sampler(**sampling)
        if stop is None:
            stops = []
        elif isinstance(stop, str):
            stops = [stop]
        elif isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
            stops = list(stop)
        else:
            raise InvalidRequest("stop must be a string or a list of strings")
        if len(ids) >= self.n_ctx:
            # the prompt plus at least one generated token must fit
            raise ContextOverflow(f"prompt is {len(ids)} tokens; context is {self.n_ctx} "
                                  f"(need room for at least 1 new token)")
        # never silently truncate; generation ends with "length" at the context edge
        max_new = min(max_tokens, self.n_ctx - len(ids))
        gen = self._loop(ids, max_new, stops, sampler)
        if stream:
            return GenerationStream(gen)
        pieces = []
        while True:
            try:
                pieces.append(next(gen))
            except StopIteration as e:
                return e.value

    def _loop(self, ids, max_new, stops, sampler):
        model, tok = self.model, self.tokenizer
        eog = set(tok.eog_ids)
        dec = tok.stream()
        sm = _StopMatcher(stops)
        # only as many positions as this request can use (prompt + new tokens) <= n_ctx
        cache = model.new_cache(min(self.n_ctx, len(ids) + max_new))
        history = list(ids)
        out_ids: list = []
        text_parts: list = []
        finish = "length"
        # greedy on a device backend: argmax on the device, only token ids cross (CUDA-graph decode)
        device = None
        if sampler.greedy and getattr(model.backend, "device_sampling", False):
            from reflex.backends.cuda_backend import PENALTY_MAX_RING, GreedyDecoder
            if sampler.repeat_penalty == 1.0:
                device = GreedyDecoder(model.backend, model, cache)
            elif (0 <= sampler.repeat_last_n <= PENALTY_MAX_RING
                  and os.environ.get("REFLEX_CUDA_DEVICE_PENALTY", "1") != "0"):
                # greedy + repeat penalty on the device (kernels/sample.cu); its GPU tests passed on
                # an H100 (session 8); REFLEX_CUDA_DEVICE_PENALTY=0 takes the host path instead
                device = GreedyDecoder(model.backend, model, cache, repeat_penalty=sampler.repeat_penalty,
                                       repeat_last_n=sampler.repeat_last_n, history=history)
        t0 = time.perf_counter()
        if device is not None:
            dev_next = device.prefill(ids)
        else:
            logits = model.forward(ids, cache, last_only=True)[-1]
        t1 = time.perf_counter()
        first_token_s = None
        t_dec0 = t1
        n_decoded = 0  # forward passes after prefill
        while True:
            nxt = dev_next if device is not None else sampler.sample(logits, history)
            if first_token_s is None:
                first_token_s = time.perf_counter() - t0
            if nxt in eog:
                finish = "stop"
                break
            out_ids.append(nxt)
            history.append(nxt)
            piece = sm.push(dec.feed(nxt))
            if piece:
                text_parts.append(piece)
                yield piece
            if sm.hit:
                finish = "stop"
                break
            if len(out_ids) >= max_new:
                break
            if device is not None:
                dev_next = device.step(nxt)
            else:
                logits = model.forward([nxt], cache, last_only=True)[-1]
            n_decoded += 1
        t2 = time.perf_counter()
        if not sm.hit:
            tail = sm.push(dec.flush())
            if not sm.hit:
                tail += sm.flush()
            if tail:
                text_parts.append(tail)
                yield tail
        prefill_s = t1 - t0
        decode_s = t2 - t_dec0
        n_gen = len(out_ids)
        timings = {
            "load_s": round(self.load_s, 6),
            "prefill_s": round(prefill_s, 6),
            "prefill_tok_s": round(len(ids) / prefill_s, 3) if prefill_s > 0 else None,
            "decode_s": round(decode_s, 6),
            "decode_tok_s": round(n_decoded / decode_s, 3) if n_decoded and decode_s > 0 else None,
            "first_token_s": round(first_token_s, 6) if first_token_s is not None else None,
        }
        if device is not None and device.capture_s is not None:
            timings["graph_capture_s"] = round(device.capture_s, 6)  # inside the first decode step
        return GenerationResult(
            text="".join(text_parts), tokens=out_ids, finish_reason=finish,
            usage={"prompt_tokens": len(ids), "completion_tokens": n_gen,
                   "total_tokens": len(ids) + n_gen},
            timings=timings, prompt_ids=list(ids))
