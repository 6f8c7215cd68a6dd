"""`ask`: retrieve, build a numbered-sources prompt, generate, keep only citations that exist.

The answer's [n] markers are checked against the sources actually given to the model: an [n] with
no such source is removed from the text and reported in `invalid_citations`, so a printed citation
always names a retrieved chunk. When no chunk reaches `min_score` the chat model is not called at
all and the answer says so (nothing to cite, nothing to invent from).
"""
from __future__ import annotations

import re
import time

from reflex.errors import InvalidRequest
from rag.retrieve import cite, search

DEFAULT_CHAT_MODEL = "smollm2"
# cosine of all-MiniLM-L6-v2 below which a chunk is taken as unrelated; chosen from the score
# distributions of on-topic and off-topic questions on python3-doc (docs/benchmarks.md, "RAG")
DEFAULT_MIN_SCORE = 0.36
DEFAULT_K = 4
REPEAT_PENALTY = 1.15  # greedy SmolLM2-135M otherwise repeats one sentence until max_tokens
SYSTEM = ("You answer questions using only the numbered sources given. After each fact, cite its "
          "source number in square brackets, like [1]. If the sources do not contain the answer, "
          "say that you do not know.")
_CIT = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")


def build_messages(question: str, hits: list) -> list:
    parts = []
    for n, h in enumerate(hits, 1):
        where = f"page {h['page']}" if h.get("page") else " > ".join(h.get("heading") or []) or h["title"]
        parts.append(f"[{n}] {where}\n{h['text'].strip()}")
    user = "Sources:\n\n" + "\n\n".join(parts) + f"\n\nQuestion: {question}\nAnswer with citations:"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def check_citations(text: str, n_sources: int):
    """-> (text without invalid markers, sorted valid numbers, sorted invalid numbers)."""
    valid, invalid = set(), set()

    def fix(m):
        nums = [int(x) for x in re.split(r"\s*,\s*", m.group(1))]
        good = [x for x in nums if 1 <= x <= n_sources]
        valid.update(good)
        invalid.update(x for x in nums if not 1 <= x <= n_sources)
        return "[" + ", ".join(map(str, good)) + "]" if good else ""

    return _CIT.sub(fix, text), sorted(valid), sorted(invalid)


def ask(question: str, index, embedder, chat_loader, k: int = DEFAULT_K, hybrid: bool = False,
        min_score: float = DEFAULT_MIN_SCORE, max_tokens: int = 160, timings: dict | None = None,
        on_text=None) -> dict:
    """chat_loader() -> reflex Engine (called only when there is something to answer from).
    on_text(piece) streams the answer as it is generated."""
    t = timings if timings is not None else {}
    if len(index) == 0:
        raise InvalidRequest(f"index {index.dir.name!r} is empty: ingest documents into it first")
    hits = search(index, embedder, question, k=k, hybrid=hybrid, timings=t)
    best = max((h["score"] for h in hits), default=0.0)
    used = [h for h in hits if h["score"] >= min_score]
    if not used:
        return {"question": question, "status": "no_relevant_sources",
                "answer": (f"I found nothing relevant to this question in index {index.dir.name!r} "
                           f"(best match cosine {best:.2f} < threshold {min_score:.2f}), so I cannot "
                           f"answer it from these documents."),
                "citations": [], "sources": [], "best_score": best, "timings": t}
    t0 = time.perf_counter()
    eng = chat_loader()
    t["chat_load_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    # shed the weakest sources until prompt + answer fit the chat model's context
    while True:
        messages = build_messages(question, used)
        if eng.template is None:
            raise InvalidRequest(f"chat model {eng.path.name} has no chat template")
        n_prompt = len(eng.tokenizer.encode(eng.template.render(messages, add_generation_prompt=True),
                                            add_special=True, parse_special=True))
        if n_prompt + max_tokens <= eng.n_ctx or len(used) == 1:
            break
        used = used[:-1]
    t["prompt_s"] = time.perf_counter() - t0
    if n_prompt + 1 > eng.n_ctx:
        from reflex.errors import ContextOverflow

        raise ContextOverflow(f"one source alone is {n_prompt} tokens; chat context is {eng.n_ctx}")
    max_new = min(max_tokens, eng.n_ctx - n_prompt)
    t0 = time.perf_counter()
    if on_text is None:
        res = eng.chat(messages, max_tokens=max_new, temperature=0, repeat_penalty=REPEAT_PENALTY)
    else:
        stream = eng.chat(messages, max_tokens=max_new, temperature=0, stream=True,
                          repeat_penalty=REPEAT_PENALTY)
        for piece in stream:
            on_text(piece)
        res = stream.result
    t["generate_s"] = time.perf_counter() - t0
    for key in ("prefill_s", "decode_s", "first_token_s", "decode_tok_s", "prefill_tok_s"):
        if res.timings.get(key) is not None:
            t[key] = res.timings[key]
    text, valid, invalid = check_citations(res.text.strip(), len(used))
    sources = [{"n": n, "citation": cite(h), "source": h["source"], "page": h.get("page"),
                "heading": h.get("heading"), "score": h["score"], "cited": n in valid,
                "char_start": h["char_start"], "char_end": h["char_end"]}
               for n, h in enumerate(used, 1)]
    return {"question": question, "status": "answered" if valid else "answered_without_citation",
            "answer": text, "citations": [s for s in sources if s["cited"]], "sources": sources,
            "invalid_citations": invalid, "best_score": best, "usage": res.usage,
            "finish_reason": res.finish_reason, "timings": t}
