"""One exception family for everything a user can get wrong.

Each error has a stable `category` (what a caller switches on), an exit code for the CLI, and a
JSON form `{"error": {"category": ..., "message": ...}}`.
"""
from __future__ import annotations

EXIT_CODES = {
    "invalid_request": 2,
    "model_not_found": 3,
    "model_format": 4,
    "unsupported_architecture": 5,
    "context_overflow": 6,
    "out_of_memory": 7,
    "internal": 70,
}


class ReflexError(Exception):
    category = "internal"

    def __init__(self, message: str, category: str | None = None):
        super().__init__(message)
        if category is not None:
            self.category = category

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.category, 70)

    def to_json(self) -> dict:
        return {"error": {"category": self.category, "message": str(self)}}


class InvalidRequest(ReflexError):
    category = "invalid_request"


class ModelNotFound(ReflexError):
    category = "model_not_found"


class ModelFormatError(ReflexError):
    """A file that is not a valid GGUF, or whose contents contradict themselves.

    `kind` names what is wrong (bad_magic, truncated, ...); `offset` is the byte offset where the
    reader noticed it (None where no single offset applies).
    """

    category = "model_format"

    def __init__(self, message: str, kind: str = "malformed", offset: int | None = None):
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{message}{where} [{kind}]")
        self.kind = kind
        self.offset = offset


class UnsupportedArchitecture(ReflexError):
    category = "unsupported_architecture"


class ContextOverflow(ReflexError):
    category = "context_overflow"
