"""Escaping of text the audited program controls (output, exception text, module and file names).

One function per output format; each takes any value (``str()`` of it), is pure and thread-safe:

- :func:`printable` -- C0/C1 control characters (ESC, BEL, backspace, DEL, ...) become visible
  ``\\xNN`` escapes, newlines and tabs become spaces; used by every other function here;
- :func:`terminal` -- :func:`printable` (no ANSI escape sequence can reach a terminal);
- :func:`markdown` -- no Markdown or HTML construct survives: every ASCII punctuation character
  that CommonMark gives meaning to is backslash-escaped (so ``![x](https://...)`` is text, never
  an image that a viewer fetches, and ``[x](javascript:...)`` is never a link), ``<``, ``>`` and
  ``&`` become entities (no raw HTML, no autolink, no entity trick), and a leading ``#``, ``+``,
  ``-``, ``=`` or ``1.`` cannot start a block;
- :func:`html_text` -- :func:`html.escape` with quotes, after :func:`printable`;
- :func:`sarif_text` -- for SARIF ``message.text``: :func:`printable`, and ``[``/``]`` escaped with a
  backslash so that no embedded link (``[text](id)``, SARIF 2.1.0 section 3.11.6) is formed.
"""
from __future__ import annotations

import html
import re
from typing import Any

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_MD_PUNCT = re.compile(r"([\\`*_{}\[\]()#+\-.!|~^\"'=:$])")


def _esc_control(m: re.Match) -> str:
    c = m.group(0)
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def printable(value: Any) -> str:
    """``str(value)`` with control characters made visible and line breaks/tabs turned to spaces."""
    s = str(value).replace("\r\n", " ").replace("\n", " ").replace("\r", " ").replace("\t", " ")
    return _CONTROL.sub(_esc_control, s)


def terminal(value: Any) -> str:
    """Safe to print on a terminal: no control character, no escape sequence, one line."""
    return printable(value)


def markdown(value: Any) -> str:
    """Literal text in Markdown (paragraph, heading or table cell): nothing in it is markup."""
    s = printable(value)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_PUNCT.sub(r"\\\1", s)


def html_text(value: Any) -> str:
    """Literal text in HTML content or a quoted attribute."""
    return html.escape(printable(value), quote=True)


def sarif_text(value: Any) -> str:
    """Literal text for a SARIF ``message.text`` (no embedded link can be formed)."""
    return printable(value).replace("[", "\\[").replace("]", "\\]")
