"""Render a GGUF's `tokenizer.chat_template` (a Jinja2 template) into a prompt string.

The environment mirrors what Hugging Face transformers gives templates in `apply_chat_template`, so that
the rendered prompt is byte-identical for the same template and inputs:

* `jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the
  `loopcontrols` extension and a no-op `{% generation %}` block tag;
* globals `raise_exception`, `strftime_now`, `dict`, `namespace` (rejecting underscore names);
* a `tojson` filter that is plain `json.dumps(..., ensure_ascii=False)` with `indent`, `separators`
  and `sort_keys` passed through (Jinja's own filter HTML-escapes, which templates don't want);
* render variables `messages`, `tools`, `documents`, `add_generation_prompt`, `bos_token`,
  `eos_token`, plus any caller kwargs (e.g. `enable_thinking`);
* message keys whose value is None are dropped before rendering, as transformers does.

Chat templates are untrusted code shipped inside model files. Anything a template does that the
sandbox refuses (dunder access, mutating methods, ...) raises `TemplateError` immediately instead of
silently rendering an empty string, and nothing outside the sandbox runs.

jinja2 is imported lazily (first compile), so importing this module costs nothing at cold start.
Compiled templates are cached per source string for the life of the process.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reflex.errors import InvalidRequest

__all__ = ["ChatTemplate", "TemplateError", "DEFAULT_CHAT_TEMPLATE"]


class TemplateError(InvalidRequest):
    """A chat template that cannot be compiled or rendered, or that broke the sandbox rules."""

    category = "invalid_request"


# Used when a model ships no `tokenizer.chat_template`. ChatML (`<|im_start|>role\n...<|im_end|>\n`) is
# the de-facto default: it is what llama.cpp falls back to for template-less models, it is what most
# instruction-tuned GGUFs without an explicit template were trained on (Qwen, SmolLM, many fine-tunes),
# and it needs no model-specific tokens beyond the two markers, so it degrades gracefully on base models.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Gemma models (gemma, gemma2, gemma3 ...) were trained on turns, not ChatML: `<start_of_turn>user\n
# ...<end_of_turn>\n<start_of_turn>model\n`, the assistant role named "model", and no system role (Google's
# template puts system text in front of the first user turn). Used when a Gemma GGUF has no template.
# BOS is left to the tokenizer (add_bos_token), which the engine applies when it encodes the prompt.
GEMMA_CHAT_TEMPLATE = (
    "{%- set ns = namespace(sys='', first=true) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{%- set ns.sys = ns.sys + message['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' }}"
    "{%- if ns.first and message['role'] == 'user' -%}{{ ns.sys }}{%- set ns.first = false -%}{%- endif -%}"
    "{{ message['content'] | trim + '<end_of_turn>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

_CACHE: dict[str, Any] = {}
_CACHE_LOCK = None  # threading.Lock, created with the environment
_ENV = None


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Same as transformers: no HTML escaping, options exposed to the template.
    import json

    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    from datetime import datetime

    return datetime.now().strftime(fmt)


def _raise_exception(message):
    raise TemplateError(f"chat template raised an exception: {message}")


def _environment():
    """Build (once) the sandboxed Jinja environment. jinja2 is imported here, not at module import."""
    global _ENV, _CACHE_LOCK
    if _ENV is not None:
        return _ENV
    import threading

    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _StrictSandbox(ImmutableSandboxedEnvironment):
        # The stock sandbox returns an Undefined for a forbidden attribute, which prints as "" and
        # only fails when used further. A template poking at internals is hostile or broken either
        # way: fail loudly at the first attempt.
        def unsafe_undefined(self, obj, attribute):
            raise SecurityError(
                f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
            )

    class _Generation(jinja2.ext.Extension):
        # `{% generation %}...{% endgeneration %}` marks assistant spans for training masks in
        # transformers; for rendering it is a pass-through.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_support"), [], [], body).set_lineno(lineno)

        def _support(self, caller):
            return caller()

    class _TemplateDict:
        # `dict(...)` and `dict.fromkeys(...)` without exposing the real type object.
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class _Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            _Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise SecurityError(f"namespace attributes may not start with '_': {name!r}")

    env = _StrictSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    _CACHE_LOCK = threading.Lock()
    _ENV = env
    return env


def _compile(source: str):
    tpl = _CACHE.get(source)
    if tpl is not None:
        return tpl
    env = _environment()
    with _CACHE_LOCK:
        tpl = _CACHE.get(source)
        if tpl is not None:
            return tpl
        import jinja2

        try:
            tpl = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template syntax error at line {e.lineno}: {e.message}") from None
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template could not be compiled: {e}") from None
        _CACHE[source] = tpl
        return tpl


def _plain(value: Any, where: str) -> Any:
    """Copy caller data into plain JSON-like types so the template sees nothing with extra methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k, where): _plain(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, where) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v, where) for v in value)
    raise InvalidRequest(
        f"{where} may only contain strings, numbers, booleans, null, lists and objects; "
        f"got {type(value).__name__}"
    )


def _normalize_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, (list, tuple)):
        raise InvalidRequest(f"messages must be a list of objects, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidRequest(f"messages[{i}] must be an object with 'role' and 'content', got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidRequest(f"messages[{i}] needs a non-empty string 'role'")
        content = m.get("content")
        if content is None and "content" not in m and not m.get("tool_calls"):
            raise InvalidRequest(f"messages[{i}] has no 'content'")
        if content is not None and not isinstance(content, (str, list)):
            raise InvalidRequest(
                f"messages[{i}].content must be a string or a list of content parts, got {type(content).__name__}"
            )
        # transformers drops None-valued keys (OpenAI clients send content=None, tool_calls=None).
        out.append(_plain({k: v for k, v in m.items() if v is not None}, f"messages[{i}]"))
    return out


def _md_str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = ""):
        if source is not None and not isinstance(source, str):
            raise TemplateError(f"chat template must be a string, got {type(source).__name__}")
        self.is_default = source is None or not source.strip()
        self.source = DEFAULT_CHAT_TEMPLATE if self.is_default else source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        self._template = None

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any], name: str | None = None) -> "ChatTemplate":
        """Build from GGUF metadata. `name` selects a named variant (`tokenizer.chat_template.<name>`,
        e.g. "tool_use"); it falls back to the main template when that variant is absent."""
        source = None
        if name:
            source = _md_str(md.get(f"tokenizer.chat_template.{name}"))
        if source is None:
            source = _md_str(md.get("tokenizer.chat_template"))
        if source is None and str(md.get("general.architecture", "")).startswith("gemma"):
            source = GEMMA_CHAT_TEMPLATE
        tokens = md.get("tokenizer.ggml.tokens")

        def tok(key: str) -> str:
            tid = md.get(key)
            if tid is None or tokens is None:
                return ""
            try:
                tid = int(tid)
                if 0 <= tid < len(tokens):
                    return _md_str(tokens[tid]) or ""
            except (TypeError, ValueError, IndexError):
                pass
            return ""

        return cls(source, bos_token=tok("tokenizer.ggml.bos_token_id"), eos_token=tok("tokenizer.ggml.eos_token_id"))

    def compile(self) -> "ChatTemplate":
        """Compile now (raises TemplateError on a syntax error). Rendering does this on first use."""
        if self._template is None:
            self._template = _compile(self.source)
        return self

    @property
    def uses_tools(self) -> bool:
        return "tools" in self.source

    def render(self, messages, add_generation_prompt: bool = True, tools=None, **kwargs) -> str:
        msgs = _normalize_messages(messages)
        if tools is not None:
            if not isinstance(tools, (list, tuple)) or not all(isinstance(t, Mapping) for t in tools):
                raise InvalidRequest("tools must be a list of JSON-schema objects")
            tools = _plain(list(tools), "tools")
        documents = kwargs.pop("documents", None)
        if documents is not None:
            documents = _plain(documents, "documents")
        extra = _plain(kwargs, "template kwargs")
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **extra}
        tpl = self.compile()._template
        import jinja2

        try:
            return tpl.render(
                messages=msgs,
                tools=tools,
                documents=documents,
                add_generation_prompt=bool(add_generation_prompt),
                **variables,
            )
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"chat template blocked by sandbox: {e}") from None
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed to render: {e}") from None
        except RecursionError:
            raise TemplateError("chat template failed to render: recursion too deep") from None
        except Exception as e:  # TypeError, ValueError, ... from template expressions
            raise TemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from None

    def __repr__(self) -> str:
        kind = "default" if self.is_default else f"{len(self.source)} chars"
        return f"ChatTemplate({kind}, bos={self.bos_token!r}, eos={self.eos_token!r})"
