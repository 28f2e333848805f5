"""The one exception type for mistakes a user can fix (a path, a flag, a port, a data row).

The CLI prints such an error as one line, `splitserve <command>: <message>`, and exits non-zero;
anything else is a bug and keeps its traceback. Messages name the file, row or flag at fault.
Depends on nothing, so any layer may raise it.
"""

from __future__ import annotations


class UserError(Exception):
    pass


def one_line(exc: BaseException) -> str:
    """The message of `exc` on one line (a multi-line message's lines joined by ' | ')."""
    text = str(exc).strip() or type(exc).__name__
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())
