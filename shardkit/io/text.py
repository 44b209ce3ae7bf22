"""Transcripts and keys as a trainer's tokenizer and a list line meet them: what makes one unusable.

Shared by validate (a shard's ``.txt`` members) and make (Kaldi ``text``, manifests), so that both name the
same problems the same way.
"""

from __future__ import annotations

import unicodedata

EMPTY_TEXT = "empty_text"  # nothing left after removing whitespace and invisible characters (BOM, zero-width)
TEXT_CONTROL = "text_control"  # a NUL or another control character than tab, CR and LF
KEY_CONTROL = "key_control"  # a key holding a control character: it cannot appear in a list line

_ALLOWED_CONTROLS = "\t\r\n"


def is_control(c: str) -> bool:
    """Whether ``c`` is a control character (Unicode category Cc), which keys and transcripts must not hold."""
    return unicodedata.category(c) == "Cc"


def visible(text: str) -> str:
    """The text without whitespace, control and format characters (BOM, zero-width space and joiners, ...)."""
    return "".join(c for c in text if not c.isspace() and unicodedata.category(c) not in ("Cc", "Cf", "Zs"))


def _codes(chars) -> str:
    return ", ".join(f"U+{ord(c):04X}" for c in sorted(set(chars))[:5])


def text_problems(text: str) -> list[tuple[str, str]]:
    """``(check, message)`` pairs for a decoded transcript: control characters, nothing visible."""
    problems = []
    controls = [c for c in text if is_control(c) and c not in _ALLOWED_CONTROLS]
    if controls:
        problems.append((TEXT_CONTROL, f"transcript holds control characters ({_codes(controls)})"))
    if not visible(text):
        problems.append((EMPTY_TEXT, "transcript is empty" if not text else
                         "transcript is only whitespace or invisible characters"))
    return problems


def key_control_problem(key: str) -> tuple[str, str] | None:
    """A key with a control character cannot appear in a list line (a tab splits it, a newline ends it)."""
    controls = [c for c in key if is_control(c)]
    return (KEY_CONTROL, f"key holds control characters ({_codes(controls)})") if controls else None
