"""Classification: a probability per label, from system1 over the labels' verbalizations.

    r = classify(engine, "I loved this film.", ["positive", "negative"])
    r.label, r.probs            # "positive", {"positive": 0.93, "negative": 0.07}

The prompt is `template` with `{text}` replaced by the text and `{labels}` (optional) by the labels
joined with ", " (plain replacement, so other braces in the template or the text are kept as
they are). Each label's verbalization (the label itself, or labels[label] when labels is a dict)
is scored by system1 as a continuation of the prompt, with a space put in front unless the prompt
ends in whitespace or the verbalization starts with it (chat=True renders the prompt as one user message
with the model's chat template and its generation prompt, so the candidates are the start of the
assistant's answer). The probabilities are the softmax over the candidates' total log-probs, or
over their mean per-token log-probs when normalize=True (so long verbalizations are not
penalized for their length).

Models with a GGUF classification head (`cls.*` tensors) are routed to reflex.embed.classify_head
when that function exists; they return their own label names.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from reflex.errors import InvalidRequest

DEFAULT_TEMPLATE = "{text}\nCategory ({labels}):"


@dataclasses.dataclass
class ClassifyResult:
    label: str               # most probable label
    probs: dict              # label -> probability (sums to 1)
    logprobs: dict           # label -> the score the softmax ran over (total or mean log-prob)
    source: str              # "system1" | "head"
    prompt: str | None = None
    scores: object = None    # the system1 ScoreResult (None for a head)

    def to_dict(self) -> dict:
        d = {"label": self.label, "probs": self.probs, "logprobs": self.logprobs, "source": self.source}
        if self.scores is not None:
            d["usage"] = self.scores.to_dict()["usage"]
            d["timings"] = self.scores.timings
        return d


def _labels(labels):
    if isinstance(labels, dict):
        names, verbal = list(labels), list(labels.values())
    elif isinstance(labels, (list, tuple)):
        names, verbal = list(labels), list(labels)
    else:
        raise InvalidRequest("labels must be a list of strings or a dict label -> verbalization")
    if not names:
        raise InvalidRequest("labels is empty")
    for n, v in zip(names, verbal):
        if not isinstance(n, str) or not n or not isinstance(v, str) or not v.strip():
            raise InvalidRequest(f"label {n!r} / verbalization {v!r}: labels must be non-empty strings")
    if len(set(names)) != len(names):
        raise InvalidRequest("labels must be distinct")
    return names, verbal


def render_prompt(text: str, names: list, template: str | None = None, chat_template=None) -> str:
    tpl = DEFAULT_TEMPLATE if template is None else template
    if not isinstance(tpl, str) or "{text}" not in tpl:
        raise InvalidRequest("template must be a string containing the placeholder {text}")
    prompt = tpl.replace("{labels}", ", ".join(names)).replace("{text}", text)
    if chat_template is not None:
        prompt = chat_template.render([{"role": "user", "content": prompt}], add_generation_prompt=True)
    return prompt


def _head_fn(engine):
    gguf = getattr(engine, "gguf", None)
    if gguf is None or not any(n.startswith("cls.") for n in gguf.tensors):
        return None
    try:
        from reflex import embed
    except ImportError:
        return None
    return getattr(embed, "classify_head", None)


def classify(engine, text, labels=None, template: str | None = None, normalize: bool = False,
             chat: bool = False) -> ClassifyResult:
    """Probability per label for `text` (see the module docstring)."""
    from reflex.system1 import score

    pair = (isinstance(text, (list, tuple)) and len(text) == 2
            and all(isinstance(x, str) for x in text))          # a (query, document) pair
    if pair:
        if not text[0].strip() or not text[1].strip():
            raise InvalidRequest("both texts of a [query, document] pair must be non-empty")
    elif not isinstance(text, str) or not text.strip():
        raise InvalidRequest("text is empty")
    head = _head_fn(engine)
    if head is not None:
        return _from_head(head(engine, tuple(text) if pair else text))
    if pair:
        raise InvalidRequest("a [query, document] pair needs a model with a classifier head "
                             "(cls.* tensors: a cross-encoder / reranker)")
    if labels is None:
        raise InvalidRequest("labels are required (this model has no classification head)")
    names, verbal = _labels(labels)
    if chat:
        if getattr(engine, "template", None) is None:
            raise InvalidRequest("model has no chat template (chat=True)")
        prompt = render_prompt(text, names, template, engine.template)
    else:
        prompt = render_prompt(text, names, template)
    cands = [v if prompt[-1:].isspace() or v[:1].isspace() else " " + v for v in verbal]
    r = score(engine.model, engine.tokenizer, prompt, cands, normalize=normalize,
              n_ctx=getattr(engine, "n_ctx", None), parse_special=chat)
    s = np.array([c.mean if normalize else c.total for c in r.candidates], dtype=np.float64)
    p = np.exp(s - s.max())
    p /= p.sum()
    best = int(np.argmax(p))
    return ClassifyResult(label=names[best], probs={n: float(v) for n, v in zip(names, p)},
                          logprobs={n: float(v) for n, v in zip(names, s)}, source="system1",
                          prompt=prompt, scores=r)


def _from_head(out) -> ClassifyResult:
    """Accepts what a classifier head returns: {label: prob} or a result with .probs / ["probs"]."""
    probs = out if isinstance(out, dict) and "probs" not in out else (
        out["probs"] if isinstance(out, dict) else getattr(out, "probs"))
    probs = {str(k): float(v) for k, v in dict(probs).items()}
    label = max(probs, key=probs.get)
    return ClassifyResult(label=label, probs=probs,
                          logprobs={k: float(np.log(v)) if v > 0 else float("-inf") for k, v in probs.items()},
                          source="head")
