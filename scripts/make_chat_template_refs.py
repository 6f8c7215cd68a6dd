"""Record reference chat-template renderings from Hugging Face transformers.

Writes tests/data/chat_template_ref.json, which tests/test_chat_template.py replays against
reflex.chat_template.ChatTemplate without needing transformers at test time.

For each local GGUF that carries `tokenizer.chat_template`, the template is read with the `gguf`
package's GGUFReader, the tokenizer is loaded with `AutoTokenizer.from_pretrained(dir, gguf_file=...)`
and every conversation below is rendered with `apply_chat_template(..., tokenize=False)`.
A few extra templates written here (exercising tools, tojson, namespace, loop controls) are rendered
through the same tokenizer via `chat_template=`.

Usage: python scripts/make_chat_template_refs.py [MODELS_DIR]
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "chat_template_ref.json"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — returns °C",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}},
            "required": ["city"],
        },
    },
}

CONVERSATIONS = [
    ("single_user", [{"role": "user", "content": "Hello!"}]),
    ("system_user", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]),
    (
        "multi_turn",
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke."},
        ],
    ),
    (
        "system_multi_turn",
        [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another?"},
            {"role": "assistant", "content": "Green."},
        ],
    ),
    ("unicode", [{"role": "user", "content": "日本語で答えて 🙂 — naïve café, Ελληνικά, עברית"}]),
    ("empty_content", [{"role": "user", "content": ""}]),
    ("empty_system", [{"role": "system", "content": ""}, {"role": "user", "content": "x"}]),
    ("multiline", [{"role": "user", "content": "line1\nline2\n\n  indented\n"}]),
    ("template_lookalike", [{"role": "user", "content": "{{ 7*7 }} {% if x %}<|im_end|>"}]),
    ("ends_with_assistant", [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]),
    ("none_key_dropped", [{"role": "user", "content": "hi", "name": None}]),
]

# Extra templates (not from a model) covering features real templates use.
EXTRA_TEMPLATES = {
    "chatml_tools": (
        "{%- if tools %}{{- '<|im_start|>system\\n' }}"
        "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
        "{{- '# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
        "{{- '\\n</tools><|im_end|>\\n' }}"
        "{%- elif messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- set ns = namespace(n=0) %}"
        "{%- for message in messages %}"
        "{%- if message.role == 'system' and loop.first %}{% continue %}{% endif %}"
        "{%- set ns.n = ns.n + 1 %}"
        "{{- '<|im_start|>' + message.role + '\\n' }}"
        "{%- if message.content is string %}{{- message.content }}{%- endif %}"
        "{%- if message.tool_calls is defined %}{%- for tc in message.tool_calls %}"
        "{{- '\\n<tool_call>\\n' + (tc.function | tojson(indent=2)) + '\\n</tool_call>' }}"
        "{%- endfor %}{%- endif %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
        "{{- '<!-- ' ~ ns.n ~ ' -->' }}"
    ),
    "whitespace_blocks": (
        "{{ bos_token }}\n"
        "{% for m in messages %}\n"
        "    {% if m['role'] == 'user' %}\n"
        "[INST] {{ m['content'] | trim }} [/INST]\n"
        "    {% elif m['role'] == 'assistant' %}\n"
        "{{ m['content'] }}{{ eos_token }}\n"
        "    {% else %}\n"
        "<<SYS>>{{ m['content'] }}<</SYS>>\n"
        "    {% endif %}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}\n"
    ),
}

TOOL_CONVERSATIONS = [
    (
        "tools_call",
        [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Zürich?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}],
            },
            {"role": "tool", "content": "21 °C"},
        ],
    ),
    ("tools_no_system", [{"role": "user", "content": "Weather?"}]),
]


def read_template(path: Path) -> str | None:
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    f = r.fields.get("tokenizer.chat_template")
    if f is None:
        return None
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def main() -> None:
    from transformers import AutoTokenizer

    models_dir = Path(sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/reflex/models"))
    cases = []
    any_tok = None
    for name in MODELS:
        path = models_dir / name
        if not path.exists():
            print(f"skip {name}: not found", file=sys.stderr)
            continue
        source = read_template(path)
        if source is None:
            print(f"skip {name}: no tokenizer.chat_template", file=sys.stderr)
            continue
        tok = AutoTokenizer.from_pretrained(str(models_dir), gguf_file=name)
        any_tok = any_tok or tok
        assert tok.chat_template == source, f"{name}: transformers template differs from GGUF field"
        convs = list(CONVERSATIONS) + (TOOL_CONVERSATIONS if "tools" in source else [])
        for cid, msgs in convs:
            for agp in (True, False):
                tools = [WEATHER_TOOL] if cid.startswith("tools") else None
                out = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp, tools=tools)
                cases.append(
                    {"template": name, "id": f"{cid}-agp{int(agp)}", "messages": msgs, "tools": tools,
                     "add_generation_prompt": agp, "bos_token": tok.bos_token or "", "eos_token": tok.eos_token or "",
                     "expected": out}
                )
    templates = {}
    for name in MODELS:
        path = models_dir / name
        if path.exists() and (src := read_template(path)) is not None:
            templates[name] = src
    if any_tok is not None:
        for tname, src in EXTRA_TEMPLATES.items():
            templates[tname] = src
            for cid, msgs in list(CONVERSATIONS) + TOOL_CONVERSATIONS:
                for agp in (True, False):
                    tools = [WEATHER_TOOL] if cid.startswith("tools") else None
                    out = any_tok.apply_chat_template(
                        msgs, tokenize=False, add_generation_prompt=agp, tools=tools, chat_template=src
                    )
                    cases.append(
                        {"template": tname, "id": f"{cid}-agp{int(agp)}", "messages": msgs, "tools": tools,
                         "add_generation_prompt": agp, "bos_token": any_tok.bos_token or "",
                         "eos_token": any_tok.eos_token or "", "expected": out}
                    )
    import transformers

    data = {"generator": f"transformers {transformers.__version__} apply_chat_template(tokenize=False)",
            "templates": templates, "cases": cases}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases over {len(templates)} templates to {OUT}")


if __name__ == "__main__":
    main()
