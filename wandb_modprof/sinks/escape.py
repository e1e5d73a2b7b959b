"""Names from a model or a file, made safe to show: in a terminal and in an SVG.

>>> escape_text("a\\x1b]0;owned\\x07b")
'a\\\\x1b]0;owned\\\\x07b'
>>> escape_text("注意 café 😀")
'注意 café 😀'

Module names, class names and model names come from user code or from a profile file, so they
can hold any `str`: terminal escape sequences (ESC, BEL, C1 controls retitle or recolour a
terminal), bidi overrides, line separators, lone surrogates (which no codec encodes strictly)
and characters XML 1.0 forbids (vl-convert aborts the whole process on those: see
`sinks/report/images.py`). `escape_text` writes each such character as Python does in a literal
(`\\x1b`, `\\u202e`, `\\ud800`, `\\U000e0001`) and keeps everything else, CJK, accents and
emoji included (the zero-width joiners inside emoji too). The result is printable and
XML-legal, and the same for the same input. A backslash is doubled only where it would
otherwise read as the start of such an escape (before `x`, `u`, `U`, a backslash or an escaped
character), so an ordinary name keeps its backslashes and two different names never escape to
the same text.
"""

from __future__ import annotations

import unicodedata

# Format characters that are part of ordinary text: the joiners inside emoji sequences.
_KEPT_FORMAT = frozenset({"\u200c", "\u200d"})
# Categories never shown raw: controls, surrogates, line / paragraph separators, and format
# characters (bidi overrides, BOM, invisible operators) but those above.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp", "Cf"})
_READS_AS_ESCAPE = frozenset("xuU\\")


def needs_escape(char: str) -> bool:
    """True for a character `escape_text` writes as an escape sequence."""
    code = ord(char)
    if code < 0x7F:
        return code < 0x20
    if 0xFDD0 <= code <= 0xFDEF or code & 0xFFFE == 0xFFFE:  # Unicode noncharacters
        return True
    return char not in _KEPT_FORMAT and unicodedata.category(char) in _ESCAPED_CATEGORIES


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape_text(text: str) -> str:
    """`text` with every control, surrogate, separator, format character and noncharacter
    written as an escape sequence (see the module docstring)."""
    if text.isprintable() and "\\" not in text:  # the common case: nothing to do
        return text
    out: list[str] = []
    for i, char in enumerate(text):
        if needs_escape(char):
            out.append(_escaped(char))
        elif char == "\\":
            follower = text[i + 1] if i + 1 < len(text) else ""
            doubled = follower in _READS_AS_ESCAPE or bool(follower and needs_escape(follower))
            out.append("\\\\" if doubled else "\\")
        else:
            out.append(char)
    return "".join(out)


def encodable(text: str) -> str:
    """`text` with lone surrogates (surrogateescape'd bytes of a name or path that was not
    UTF-8) as U+FFFD: every consumer that encodes it (a file, W&B's `wandb.Html`) can."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text
