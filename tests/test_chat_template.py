"""Tests for reflex.chat_template.

The exactness tests check our ChatTemplate against *recorded outputs of Hugging Face transformers*
(`tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`), stored in
tests/data/chat_template_ref.json by scripts/make_chat_template_refs.py. transformers is not needed
(nor imported) at test time.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from reflex.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplate, TemplateError
from reflex.errors import InvalidRequest

REF = json.loads((Path(__file__).parent / "data" / "chat_template_ref.json").read_text(encoding="utf-8"))
CASES = REF["cases"]
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODELS_DIR = Path(os.environ.get("REFLEX_MODELS", "~/.cache/reflex/models")).expanduser()


def test_reference_covers_smollm2():
    smol = [c for c in CASES if c["template"] == SMOL]
    assert len(smol) >= 10
    assert {c["add_generation_prompt"] for c in smol} == {True, False}


@pytest.mark.parametrize("case", CASES, ids=[f"{c['template'][:20]}:{c['id']}" for c in CASES])
def test_matches_transformers(case):
    tpl = ChatTemplate(REF["templates"][case["template"]], bos_token=case["bos_token"], eos_token=case["eos_token"])
    out = tpl.render(case["messages"], add_generation_prompt=case["add_generation_prompt"], tools=case["tools"])
    assert out == case["expected"]


def test_compiled_once_and_cached():
    import reflex.chat_template as ct

    src = REF["templates"][SMOL]
    a = ChatTemplate(src).compile()
    b = ChatTemplate(src).compile()
    assert a._template is b._template
    assert src in ct._CACHE


def test_jinja_not_imported_at_module_import():
    import subprocess

    code = "import sys, reflex.chat_template as c; c.ChatTemplate(None); print('jinja2' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


SANDBOX_PAYLOADS = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ raise_exception.__globals__['os'] }}",
    "{{ cycler.__init__.__globals__.os.popen('echo pwned').read() }}",
    "{{ self._TemplateReference__context }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ dict.__call__.__globals__ }}",
    "{{ lipsum.__globals__['os'].system('echo pwned') }}",
    "{% set x = messages.append({'role': 'user', 'content': 'x'}) %}{{ x }}",
    "{{ messages[0].update({'role': 'evil'}) }}",
    "{{ '{0.__class__}'.format(messages) }}",
    "{% set ns = namespace(_secret=1) %}{{ ns }}",
    "{{ strftime_now.__code__ }}",
]


@pytest.mark.parametrize("payload", SANDBOX_PAYLOADS)
def test_sandbox_escape_blocked(payload, tmp_path):
    marker = tmp_path / "pwned"
    payload = payload.replace("echo pwned", f"touch {marker}")
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(TemplateError) as ei:
        ChatTemplate(payload).render(msgs)
    assert ei.value.category == "invalid_request"
    assert isinstance(ei.value, InvalidRequest)
    assert not marker.exists()
    assert msgs == [{"role": "user", "content": "hi"}]


def test_raise_exception():
    src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok"
    tpl = ChatTemplate(src)
    assert tpl.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(TemplateError, match="Conversation must start with user"):
        tpl.render([{"role": "assistant", "content": "x"}])


@pytest.mark.parametrize("src", ["{% for m in messages %}{{ m }}", "{{ messages[ }}", "{% endif %}", "{% bogus %}"])
def test_syntax_error(src):
    with pytest.raises(TemplateError, match="syntax error") as ei:
        ChatTemplate(src).render([{"role": "user", "content": "x"}])
    assert ei.value.category == "invalid_request"
    with pytest.raises(TemplateError):
        ChatTemplate(src).compile()


def test_runtime_error_is_template_error():
    with pytest.raises(TemplateError, match="failed to render"):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render([{"role": "user", "content": "x"}])


def test_default_template_is_chatml():
    for src in (None, "", "   "):
        tpl = ChatTemplate(src)
        assert tpl.is_default and tpl.source == DEFAULT_CHAT_TEMPLATE
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert ChatTemplate(None).render(msgs) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ChatTemplate(None).render(msgs, add_generation_prompt=False).endswith("U<|im_end|>\n")


@pytest.mark.parametrize(
    "bad",
    [
        "hello",
        {"role": "user", "content": "x"},
        None,
        ["not a dict"],
        [{"content": "no role"}],
        [{"role": "", "content": "x"}],
        [{"role": 3, "content": "x"}],
        [{"role": "user"}],
        [{"role": "user", "content": 42}],
        [{"role": "user", "content": object()}],
    ],
)
def test_bad_messages(bad):
    with pytest.raises(InvalidRequest):
        ChatTemplate(None).render(bad)


def test_bad_tools():
    with pytest.raises(InvalidRequest):
        ChatTemplate(None).render([{"role": "user", "content": "x"}], tools="nope")
    with pytest.raises(InvalidRequest):
        ChatTemplate(None).render([{"role": "user", "content": "x"}], tools=[1, 2])


def test_tojson_matches_transformers_semantics():
    tpl = ChatTemplate("{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ '<&>' | tojson }}")
    tools = [{"name": "café", "x": [1, 2]}]
    out = tpl.render([{"role": "user", "content": ""}], tools=tools)
    assert out == (
        json.dumps(tools, ensure_ascii=False) + "|" + json.dumps(tools[0], ensure_ascii=False, indent=2) + '|"<&>"'
    )


def test_kwargs_strftime_and_tokens():
    tpl = ChatTemplate(
        "{{ bos_token }}{% if enable_thinking %}T{% endif %}{{ strftime_now('%Y') | length }}{{ eos_token }}",
        bos_token="<s>",
        eos_token="</s>",
    )
    assert tpl.render([], enable_thinking=True) == "<s>T4</s>"
    assert tpl.render([]) == "<s>4</s>"


def test_generation_tag_and_loopcontrols():
    src = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    assert ChatTemplate(src).render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a"


def test_from_metadata():
    md = {
        "tokenizer.chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
        "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>"],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    tpl = ChatTemplate.from_metadata(md)
    assert (tpl.bos_token, tpl.eos_token) == ("<s>", "</s>")
    assert tpl.render([{"role": "user", "content": "x"}]) == "<s>x</s>"
    md["tokenizer.chat_template.tool_use"] = "TOOLS"
    assert ChatTemplate.from_metadata(md, name="tool_use").render([]) == "TOOLS"
    assert ChatTemplate.from_metadata(md, name="rag").render([{"role": "user", "content": "y"}]) == "<s>y</s>"
    empty = ChatTemplate.from_metadata({})
    assert empty.is_default and empty.bos_token == "" and empty.eos_token == ""
    odd = ChatTemplate.from_metadata({"tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.bos_token_id": 7})
    assert odd.bos_token == ""


@pytest.mark.skipif(not (MODELS_DIR / SMOL).exists(), reason="SmolLM2 GGUF not downloaded")
def test_from_real_gguf_metadata():
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(str(MODELS_DIR / SMOL))

    def val(key):
        f = r.fields[key]
        return f.contents() if hasattr(f, "contents") else bytes(f.parts[f.data[0]]).decode()

    md = {k: val(k) for k in ("tokenizer.chat_template", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")}
    f = r.fields["tokenizer.ggml.tokens"]
    md["tokenizer.ggml.tokens"] = [bytes(f.parts[i]).decode() for i in f.data]
    tpl = ChatTemplate.from_metadata(md)
    assert tpl.source == REF["templates"][SMOL]
    case = next(c for c in CASES if c["template"] == SMOL and c["id"] == "multi_turn-agp1")
    assert tpl.render(case["messages"], add_generation_prompt=True) == case["expected"]


def test_gemma_without_template_gets_gemma_turns():
    """A template-less Gemma GGUF gets Gemma's turn format (the format Google's own template writes:
    no system role, system text before the first user turn, assistant named "model"), not ChatML."""
    from reflex.chat_template import ChatTemplate

    t = ChatTemplate.from_metadata({"general.architecture": "gemma3"})
    out = t.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}])
    assert out == ("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                   "<start_of_turn>model\nHello!<end_of_turn>\n"
                   "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    assert "<|im_start|>" in ChatTemplate.from_metadata({"general.architecture": "llama"}).render(
        [{"role": "user", "content": "Hi"}])
