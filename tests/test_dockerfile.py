"""Static checks of docker/Dockerfile (no Docker daemon here or in CI): a small hand-written parser
(FROM ... AS name, COPY/ADD sources, RUN, ENTRYPOINT/CMD, ENV) and assertions about the stages, so
a renamed path, a lost stage or a dependency creeping back breaks CI. The references are the repo
itself (paths that must exist, pyproject.toml's extras and console scripts, kernels/build.py's
options), not the Dockerfile. Runs in CI; needs nothing beyond the standard library."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

try:
    import tomllib   # 3.11+; on 3.10 the two pyproject checks skip
except ImportError:
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def parse(text: str) -> list:
    """Stages: [{"name", "base", "instrs": [(INSTR, args str)]}]; continuation lines joined, comments
    and blank lines dropped. Instructions before the first FROM (global ARGs) go to a stage None."""
    lines, cur = [], ""
    for raw in text.splitlines():
        s = raw.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        if s.startswith("#"):           # a comment inside a continued instruction
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        lines.append(cur + s)
        cur = ""
    if cur:
        lines.append(cur)
    stages = [{"name": None, "base": None, "instrs": []}]
    for ln in lines:
        instr, _, args = ln.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            m = re.fullmatch(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", args.strip(), re.IGNORECASE)
            assert m, f"unparsable FROM line: {ln!r}"
            stages.append({"name": m.group(2), "base": m.group(1), "instrs": []})
        else:
            stages[-1]["instrs"].append((instr, args.strip()))
    return stages


def copy_args(args: str):
    """(flags dict, sources, dest) of a COPY/ADD, shell or JSON form."""
    flags = {}
    while args.startswith("--"):
        flag, _, args = args.partition(" ")
        k, _, v = flag[2:].partition("=")
        flags[k] = v
        args = args.lstrip()
    parts = json.loads(args) if args.startswith("[") else shlex.split(args)
    return flags, parts[:-1], parts[-1]


def exec_form(args: str) -> list:
    return json.loads(args) if args.startswith("[") else ["/bin/sh", "-c", args]


@pytest.fixture(scope="module")
def stages():
    return parse(DOCKERFILE.read_text())


def by_name(stages, name):
    for s in stages:
        if s["name"] == name:
            return s
    raise AssertionError(f"no stage named {name!r} in docker/Dockerfile")


def lineage(stages, name) -> list:
    """The stage and the stages it is built FROM, nearest first."""
    out, names = [], {s["name"] for s in stages if s["name"]}
    while name in names:
        s = by_name(stages, name)
        out.append(s)
        name = s["base"]
    return out


def instrs(stages, name, kind) -> list:
    return [a for s in lineage(stages, name) for i, a in s["instrs"] if i == kind]


def test_parser_on_a_small_example():
    st = parse('ARG X=1\nFROM img:${X} AS one\n# c\nRUN a && \\\n    b\nCOPY --from=one ["a b", "c"]\n'
               'FROM one\nCMD ["x"]\n')
    assert [s["name"] for s in st] == [None, "one", None]
    assert st[1]["instrs"][0] == ("RUN", "a &&  b")
    assert copy_args(st[1]["instrs"][1][1]) == ({"from": "one"}, ["a b"], "c")
    assert st[2]["base"] == "one" and exec_form(st[2]["instrs"][0][1]) == ["x"]


def test_targets_exist(stages):
    names = {s["name"] for s in stages}
    for t in ("reflex", "adapter", "runpod-lb"):
        assert t in names, f"target {t!r} missing"


def builder(stages):
    for s in stages:
        if any(i == "RUN" and ("kernels/build.py" in a or "nvcc" in a) for i, a in s["instrs"]):
            return s
    raise AssertionError("no stage runs nvcc / kernels/build.py")


def test_builder_compiles_kernels_with_real_options(stages):
    b = builder(stages)
    assert "devel" in b["base"], f"the kernel builder needs a CUDA devel image (nvcc), got {b['base']}"
    run = next(a for i, a in b["instrs"] if i == "RUN" and "kernels/build.py" in a)
    src = (ROOT / "kernels" / "build.py").read_text()
    for opt in re.findall(r"(--[a-z][a-z-]*)", run):
        if opt in ("--no-install-recommends",):
            continue
        assert f'"{opt}"' in src, f"kernels/build.py has no option {opt} (Dockerfile: {run!r})"
    assert "--require" in run, "a builder without nvcc must fail, not ship an image without kernels"


def test_every_copy_source_exists(stages):
    n = 0
    for s in stages:
        for i, a in s["instrs"]:
            if i not in ("COPY", "ADD"):
                continue
            flags, srcs, _ = copy_args(a)
            if "from" in flags:
                continue              # a path inside another stage, checked below
            for src in srcs:
                assert not src.startswith(("http://", "https://")), f"{i} of a URL: {src}"
                assert (ROOT / src).exists(), f"{i} source {src!r} does not exist in the repo"
                n += 1
    assert n >= 5


def test_runtime_stages_get_the_fatbin_from_the_builder(stages):
    b = builder(stages)
    run = next(a for i, a in b["instrs"] if i == "RUN" and "kernels/build.py" in a)
    out = re.search(r"--out\s+(\S+)", run).group(1)
    workdir = next(a for i, a in b["instrs"] if i == "WORKDIR")
    built = str(Path(workdir) / out)
    for target in ("reflex", "adapter", "runpod-lb"):
        got = []
        for s in lineage(stages, target):
            for i, a in s["instrs"]:
                if i == "COPY":
                    flags, srcs, dest = copy_args(a)
                    if flags.get("from") == b["name"]:
                        got += [(src, dest, s) for src in srcs]
        assert got, f"{target}: no COPY --from={b['name']} (the engine would have no kernels)"
        src, dest, s = got[0]
        assert built.startswith(src.rstrip("/")), f"{target} copies {src}, the builder writes {built}"
        # the runtime looks for reflex/_kernels/reflex.fatbin beside the installed package
        assert dest.rstrip("/").endswith("reflex/_kernels"), dest
        # pip install . copies reflex/_kernels/*.fatbin (package data) into site-packages: the
        # fatbin has to be there before it, in build order (base stage first)
        seq = [(i, a) for st in reversed(lineage(stages, target)) for i, a in st["instrs"]]
        k_copy = next(k for k, (i, a) in enumerate(seq) if i == "COPY" and f"--from={b['name']}" in a)
        k_pip = next(k for k, (i, a) in enumerate(seq) if i == "RUN" and "pip install" in a)
        assert k_copy < k_pip, f"{target}: the fatbin arrives after pip install"


def _pyproject() -> dict:
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pip_extras(stages, target) -> set:
    extras = set()
    for a in instrs(stages, target, "RUN"):
        for m in re.finditer(r"pip install[^&;]*", a):
            cmd = m.group(0)
            for ex in re.findall(r"\.\[([^\]]*)\]", cmd):
                extras |= {e.strip() for e in ex.split(",")}
            assert "cupy" not in cmd, f"{target} installs cupy directly: {cmd}"
    return extras


def test_no_stage_installs_cupy(stages):
    """The engine's CUDA backend talks to the driver API (reflex/backends/cuda_driver.py) and
    needs no CuPy; an extra that pulls cupy in is ~1 GB of image for nothing."""
    py = _pyproject()
    extras = py["project"]["optional-dependencies"]
    for target in ("reflex", "adapter", "runpod-lb"):
        for ex in _pip_extras(stages, target):
            assert ex in extras, f"{target}: pip extra {ex!r} not in pyproject.toml"
            assert not any("cupy" in d for d in extras[ex]), f"{target}: extra {ex!r} pulls cupy"
    assert {"adapter", "rag"} <= _pip_extras(stages, "adapter")


def test_entrypoints_are_console_scripts(stages):
    py = _pyproject()
    scripts = set(py["project"]["scripts"])
    for target in ("reflex", "adapter", "runpod-lb"):
        ep = instrs(stages, target, "ENTRYPOINT")
        assert ep, f"{target} has no ENTRYPOINT"
        argv = exec_form(ep[0])
        prog = argv[0]
        if argv[:2] == ["/bin/sh", "-c"]:
            prog = shlex.split(argv[2])[0]
            if prog == "exec":
                prog = shlex.split(argv[2])[1]
        assert prog in scripts, f"{target}: entrypoint {prog!r} is not a console script of pyproject"
