"""Words that came from elsewhere (a gateway's error, an environment's failure reason), made safe to show:
one printable line, bounded, known secrets masked."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from typing import Final

MAX_DETAIL_CHARS: Final = 300  # Relax surfaces only an 8 KiB tail of command.log; one line stays short
REDACTED: Final = "[redacted]"
_ELLIPSIS: Final = "..."


def safe_text(text: str, *, limit: int = MAX_DETAIL_CHARS, secrets: Iterable[str] = ()) -> str:
    """`text` as one printable line of at most `limit` characters, with every secret masked.

    Masking runs before truncation so a secret cannot survive as a cut-off prefix of itself. Control,
    format (bidi overrides, zero-width) and unassigned characters become spaces: words from elsewhere must
    not rewrite the user's terminal or split the one-line error Relax shows.
    """
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = "".join(" " if unicodedata.category(ch).startswith("C") else ch for ch in text)
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: max(limit - len(_ELLIPSIS), 0)].rstrip() + _ELLIPSIS
    return text
