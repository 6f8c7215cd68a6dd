"""Document loaders: file -> Document(blocks), one block per page (PDF) or per section (Markdown, HTML).

Char offsets in a Block are positions in its `text` coordinate system, stated per format:
  text/markdown: offsets into the decoded file (so `open(f).read()[a:b]` is the chunk);
  html:          offsets into the extracted visible text of the page (`Document.text`);
  pdf:           offsets into that page's extracted text (page numbers are 1-based).
A file that cannot be read (permissions, encrypted PDF, binary, broken) raises LoadError; the caller
reports and skips it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

FORMATS = {".pdf": "pdf", ".md": "markdown", ".markdown": "markdown", ".html": "html",
           ".htm": "html", ".txt": "text", ".text": "text", ".rst": "text"}


class LoadError(Exception):
    """Why one file was skipped (`reason` is a short category: unreadable, encrypted, binary, ...)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Block:
    text: str
    start: int                      # char offset of text[0] in the document's coordinate system
    page: int | None = None         # 1-based (PDF)
    heading: tuple = ()             # heading path, outermost first (Markdown, HTML)


@dataclass
class Document:
    source: str
    kind: str
    title: str
    blocks: list = field(default_factory=list)


def detect_format(path: str) -> str | None:
    return FORMATS.get(os.path.splitext(path)[1].lower())


def load(path: str, kind: str | None = None, data: bytes | None = None) -> Document:
    """Load one file. `data` (the raw bytes, already read for hashing) avoids a second read."""
    kind = kind or detect_format(path) or "text"
    if data is None:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise LoadError("unreadable", f"{path}: {e.strerror or e}") from None
    if kind == "pdf":
        return _load_pdf(path, data)
    text = _decode(path, data)
    title = os.path.basename(path)
    if kind == "markdown":
        return _load_markdown(path, text, title)
    if kind == "html":
        return _load_html(path, text, title)
    return Document(path, "text", title, [Block(text, 0)] if text.strip() else [])


def _decode(path: str, data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise LoadError("binary", f"{path}: binary file (NUL bytes), not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        # latin-1 never fails; most non-UTF-8 text in the wild is cp1252/latin-1
        text = data.decode("latin-1")
    return text.replace("\r\n", "\n").replace("\r", "\n")


# ------------------------------------------------------------------------------------------ pdf
def _load_pdf(path: str, data: bytes) -> Document:
    import io
    import logging

    import pypdf

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # pypdf warns on every odd object
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            # an owner-password-only PDF opens with the empty user password; anything else is locked
            try:
                ok = reader.decrypt("")
            except Exception:
                ok = 0
            if not ok:
                raise LoadError("encrypted", f"{path}: encrypted PDF (a password is needed)")
        title = os.path.basename(path)
        try:
            meta = reader.metadata
            if meta and meta.title and str(meta.title).strip():
                title = str(meta.title).strip()
        except Exception:
            pass
        blocks = []
        for i, page in enumerate(reader.pages):
            text = (page.extract_text() or "").replace("\r\n", "\n")
            if text.strip():
                blocks.append(Block(text, 0, page=i + 1))
    except LoadError:
        raise
    except Exception as e:  # pypdf raises many types on broken files
        msg = str(e) or type(e).__name__
        reason = "encrypted" if "decrypt" in msg.lower() or "encrypt" in msg.lower() else "broken"
        raise LoadError(reason, f"{path}: cannot read PDF: {msg}") from None
    return Document(path, "pdf", title, blocks)


# ------------------------------------------------------------------------------------- markdown
_ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def _load_markdown(path: str, text: str, title: str) -> Document:
    """Sections split at ATX (`# x`) and setext (`x` + `===`) headings, never inside fenced code."""
    lines = text.split("\n")
    offs, o = [], 0
    for ln in lines:
        offs.append(o)
        o += len(ln) + 1
    heads = []                     # (line index where the section body starts, level, heading text, heading line)
    fence = None
    for i, ln in enumerate(lines):
        m = _FENCE.match(ln)
        if m:
            if fence is None:
                fence = m.group(1)[0]
            elif m.group(1)[0] == fence:
                fence = None
            continue
        if fence is not None:
            continue
        m = _ATX.match(ln)
        if m:
            heads.append((i + 1, len(m.group(1)), m.group(2).strip(), i))
            continue
        m = _SETEXT.match(ln)
        if m and i > 0 and lines[i - 1].strip() and (not heads or heads[-1][0] <= i - 1):
            # the previous line is the heading text (a paragraph's last line cannot start one)
            if i - 2 < 0 or not lines[i - 2].strip() or (heads and heads[-1][0] == i - 1):
                heads.append((i + 1, 1 if m.group(1)[0] == "=" else 2, lines[i - 1].strip(), i - 1))
    blocks, path_stack = [], []
    first_h1 = next((h[2] for h in heads if h[1] == 1), None)

    def add(start_line, end_line, heading):
        if start_line >= end_line:
            return
        a = offs[start_line]
        b = offs[end_line - 1] + len(lines[end_line - 1])
        body = text[a:b]
        if body.strip():
            blocks.append(Block(body, a, heading=tuple(heading)))

    prev_start = 0
    for body_start, level, htext, hline in heads:
        add(prev_start, hline, [h for _, h in path_stack])
        path_stack = [(lv, h) for lv, h in path_stack if lv < level] + [(level, htext)]
        prev_start = body_start
    add(prev_start, len(lines), [h for _, h in path_stack])
    return Document(path, "markdown", first_h1 or title, blocks)


# ----------------------------------------------------------------------------------------- html
# elements whose text is never shown or is site chrome rather than content
_SKIP_TAGS = {"script", "style", "noscript", "template", "nav", "svg", "head", "iframe", "object",
              "canvas", "button", "select", "form", "aside", "footer"}
_SKIP_ROLES = {"navigation", "banner", "contentinfo", "search", "menu", "menubar", "complementary"}
# class names that mark navigation in common generators (Sphinx, MkDocs, Docusaurus ...)
_SKIP_CLASSES = {"sphinxsidebar", "related", "footer", "navigation", "navbar", "nav", "sidebar",
                 "breadcrumb", "breadcrumbs", "menu", "toc-drawer", "headerlink", "skip-link",
                 "mobile-nav", "sphinxsidebarwrapper"}
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
         "source", "track", "wbr"}
_BREAK = {"p", "div", "li", "ul", "ol", "dl", "dt", "dd", "pre", "table", "tr", "blockquote",
          "section", "article", "main", "header", "h1", "h2", "h3", "h4", "h5", "h6", "figure",
          "figcaption", "hr", "br", "details", "summary"}
_PARA = {"p", "pre", "table", "ul", "ol", "dl", "blockquote", "section", "article", "hr",
         "h1", "h2", "h3", "h4", "h5", "h6", "dt", "figure"}
_HEAD = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_WS = re.compile(r"[ \t\n\r\f\v]+")


class _VisibleText(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack = []           # (tag, skipping)
        self.out = []             # pieces of visible text
        self.n = 0                # chars emitted so far
        self.pending_break = 0    # 0 none, 1 newline, 2 blank line
        self.title = []
        self.in_title = False
        self.pre = 0
        self.heading = None       # (level, [text pieces]) while inside h1..h6
        self.sections = []        # (offset, level, text) where a heading starts

    @property
    def skipping(self) -> bool:
        return bool(self.stack) and self.stack[-1][1]

    def handle_starttag(self, tag, attrs):
        if tag == "title":
            self.in_title = True
        skip = self.skipping
        if not skip:
            a = dict(attrs)
            cls = set((a.get("class") or "").split())
            skip = (tag in _SKIP_TAGS or (a.get("role") or "") in _SKIP_ROLES
                    or bool(cls & _SKIP_CLASSES) or "hidden" in a
                    or (a.get("aria-hidden") == "true"))
        if tag in _VOID:
            if tag in ("br", "hr") and not skip:
                self._brk(2 if tag == "hr" else 1)
            return
        self.stack.append((tag, skip))
        if skip:
            return
        if tag in _BREAK:
            self._brk(2 if tag in _PARA else 1)
        if tag == "pre":
            self.pre += 1
        if tag in _HEAD:
            self.heading = (_HEAD[tag], [], self.n)

    def handle_endtag(self, tag):
        if tag == "title":
            self.in_title = False
        if not any(t == tag for t, _ in self.stack):
            return  # stray end tag
        while self.stack:
            t, skip = self.stack.pop()
            if not skip:
                if t == "pre":
                    self.pre = max(0, self.pre - 1)
                if t in _HEAD and self.heading is not None:
                    level, parts, _ = self.heading
                    text = _WS.sub(" ", "".join(parts)).strip()
                    if text:
                        self.sections.append((self.heading[2], level, text))
                    self.heading = None
                if t in _BREAK:
                    self._brk(2 if t in _PARA else 1)
            if t == tag:
                break

    def handle_data(self, data):
        if self.in_title:
            self.title.append(data)
            return
        if self.skipping:
            return
        if not self.pre:
            data = _WS.sub(" ", data)
            if not data.strip():
                if self.out and not self.out[-1].endswith((" ", "\n")) and not self.pending_break:
                    self._emit(" ")
                return
        if self.pending_break:
            if self.out:
                tail = "\n\n" if self.pending_break == 2 else "\n"
                self._emit(tail)
            self.pending_break = 0
            if not self.pre:
                data = data.lstrip()
        elif self.out and self.out[-1].endswith("\n") and not self.pre:
            data = data.lstrip()
        if self.heading is not None:
            if not self.heading[1]:
                self.heading = (self.heading[0], self.heading[1], self.n)
            self.heading[1].append(data)
        self._emit(data)

    def _emit(self, s):
        if s:
            self.out.append(s)
            self.n += len(s)

    def _brk(self, k):
        self.pending_break = max(self.pending_break, k)


def _load_html(path: str, text: str, title: str) -> Document:
    p = _VisibleText()
    try:
        p.feed(text)
        p.close()
    except Exception as e:  # html.parser is lenient; this is a last resort
        raise LoadError("broken", f"{path}: cannot parse HTML: {e}") from None
    body = "".join(p.out)
    page_title = _WS.sub(" ", "".join(p.title)).strip() or title
    blocks = []
    # a section runs from its heading to the next heading; the heading text itself stays in the block
    marks = sorted(p.sections)
    stack = []
    prev = 0
    prev_path = ()
    for off, level, htext in marks:
        _add_span(blocks, body, prev, off, prev_path)
        stack = [(lv, h) for lv, h in stack if lv < level] + [(level, htext)]
        prev, prev_path = off, tuple(h for _, h in stack)
    _add_span(blocks, body, prev, len(body), prev_path)
    return Document(path, "html", page_title, blocks)


def _add_span(blocks, body, a, b, heading):
    seg = body[a:b]
    if seg.strip():
        blocks.append(Block(seg, a, heading=heading))
