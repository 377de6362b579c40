"""Text for the exported header's C++: literals and ``//`` comment values.

Shared by :mod:`codegen.export` (the header's comment) and :mod:`codegen.dispatch_table`
(the dispatch tables of both modes).
"""

from __future__ import annotations

import math
import re

#: How the exported header declares its data (the GPU name and the dispatch tables):
#: ``static``, so each translation unit, and so each shared library, has its own copy. As C++17
#: ``inline`` variables g++ emits them STB_GNU_UNIQUE, one object per process even across
#: libraries loaded with RTLD_LOCAL, and every library built from an exported header would
#: read the first-loaded one's tables, kernel pointers included: another tuning's picks, or an
#: sm_90a build's Hopper kernels called from a plain-sm_90 build (seen on the H200).
DATA_DECL = "static constexpr"


def cpp_bool(value: bool) -> str:
    return "true" if value else "false"


def braced(*fields: object) -> str:
    """A C++ aggregate initialiser, ``{a, b, c}``."""
    return "{" + ", ".join(map(str, fields)) + "}"


def c_string(s: str) -> str:
    """A C/C++ string literal of ``s``'s UTF-8 bytes: printable ASCII as is except ``"``,
    ``\\`` and ``?`` (escaped), every other byte as a three-digit octal escape (which, unlike
    ``\\x``, cannot swallow the characters after it)."""
    out: list[str] = []
    for byte in s.encode("utf-8", "surrogatepass"):
        ch = chr(byte)
        if ch in '"\\?':
            out.append("\\" + ch)
        elif 0x20 <= byte < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


#: Characters that must not reach a // comment: controls (a newline ends the comment, NUL and
#: others confuse tools), line separators, zero-width and bidirectional format characters.
NOT_IN_COMMENT = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064"
    r"\u2066-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff]"
)


def comment_safe(s: str) -> str:
    """A value for a ``//`` comment: one line, each character it must not hold as ``?``.

    A backslash at the very end of a comment line would splice the next line into the
    comment; :func:`seal_comments` guards the lines themselves."""
    return " ".join(NOT_IN_COMMENT.sub("?", str(s)).split())


def seal_comments(text: str) -> str:
    """``text`` with every line that ends in a backslash (spaces after it do not stop
    compilers from splicing) closed by ``  //``, so no comment continues onto the next line."""
    lines = text.split("\n")
    return "\n".join(
        line.rstrip() + "  //" if line.rstrip().endswith("\\") else line for line in lines
    )


def number(x: float | None, spec: str) -> str:
    """``x`` formatted by ``spec``, or ``?`` when unknown or not finite."""
    return "?" if x is None or not math.isfinite(x) else format(x, spec)
