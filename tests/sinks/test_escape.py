"""`escape_text`: every name a terminal or an SVG would misread is shown as escapes, ordinary
text (CJK, accents, emoji) as is, and two different names never escape to the same text."""

from __future__ import annotations

import itertools
import re

import pytest

from wandb_modprof.sinks.escape import escape_text

# XML 1.0's Char production, and what a terminal acts on (C0, DEL, C1)
XML_CHAR = re.compile("[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\x1bb", "a\\x1bb"),
        ("\x1b]0;owned\x07\x1b[31mRED", "\\x1b]0;owned\\x07\\x1b[31mRED"),
        ("\x00\x01\x08\x0b\t\n\r", "\\x00\\x01\\x08\\x0b\\x09\\x0a\\x0d"),
        ("a\x7fb\x85c\x9b", "a\\x7fb\\x85c\\x9b"),  # DEL, C1 (NEL, CSI)
        ("a\ud800", "a\\ud800"),
        ("\udfff", "\\udfff"),
        ("a\ufffe\uffff\ufdd0", "a\\ufffe\\uffff\\ufdd0"),  # noncharacters
        ("\U0001fffe", "\\U0001fffe"),
        ("evil\u202etxt.exe", "evil\\u202etxt.exe"),  # a bidi override
        ("line\u2028sep", "line\\u2028sep"),
        ("\ufeffbom", "\\ufeffbom"),
    ],
)
def test_controls_surrogates_and_noncharacters_are_escaped(raw: str, shown: str) -> None:
    assert escape_text(raw) == shown
    assert escape_text(raw).isprintable()
    assert XML_CHAR.fullmatch(escape_text(raw))
    assert escape_text(raw).encode("utf-8")  # no lone surrogate left


@pytest.mark.parametrize(
    "text",
    [
        "layer1.0.conv1",
        "注意力層",
        "café_naïve",
        "😀",
        "👨\u200d👩\u200d👧",
        "a b",
        "C:\\temp",
        "Ωμέγα",
    ],
)
def test_ordinary_text_is_kept(text: str) -> None:
    assert escape_text(text) == text


def test_a_backslash_is_doubled_only_where_it_would_read_as_an_escape() -> None:
    assert escape_text("a\\x1bb") == "a\\\\x1bb"  # a literal backslash-x: not ESC
    assert escape_text("a\\\x1b") == "a\\\\\\x1b"
    assert escape_text("a\\b") == "a\\b"
    assert escape_text("a\\") == "a\\"


def test_different_names_escape_differently() -> None:
    alphabet = ["a", "x", "u", "\\", "\x1b", "\ud800", "\x00"]
    names = ["".join(p) for n in range(1, 5) for p in itertools.product(alphabet, repeat=n)]
    shown = [escape_text(n) for n in names]
    assert len(set(shown)) == len(names)
    assert shown == [escape_text(n) for n in names]  # deterministic
