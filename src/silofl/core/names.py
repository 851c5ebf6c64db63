"""Names from outside (a card's site name, a run id, a step) never become paths: a strict name pattern, and a
join that is refused unless it resolves inside the folder it is meant for."""

from __future__ import annotations

import re
from pathlib import Path

from silofl.core.errors import PeerModelRejected

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # a plain name, never a path
SITE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a site's name (a folder name, ≤ 64)


def plain_name(value: object, what: str, pattern: re.Pattern = NAME_RE) -> str:
    """``value`` if it is a plain name (ASCII letters, digits, '_', '.', '-'; not starting with '.', '_' or
    '-'); else refused (PeerModelRejected, one line naming ``what``)."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise PeerModelRejected(f"{what} must be a plain name ({pattern.pattern}), got {str(value)[:80]!r}")
    return value


def inside(folder: Path, *parts: str) -> Path:
    """``folder/parts…``, refused unless it resolves inside ``folder``."""
    p = Path(folder).joinpath(*parts).resolve()
    if not p.is_relative_to(Path(folder).resolve()):
        raise PeerModelRejected(f"{'/'.join(parts)[:80]!r} resolves outside the folder {folder}")
    return p
