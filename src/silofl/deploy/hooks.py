"""Site hooks: what arms a deployed site's worker around the steps it runs, chosen by a file its operator put
in the site's folder (as Flower's mods wrap a ClientApp). A hook is registered by the package that provides
it, as a plug-in of the entry-point group ``silofl.site_hooks`` — silofl's own gradient-canary audit
(:class:`silofl.auditing.gradient.SiteAudit`) is declared in pyproject.toml the way another package would
declare one — so the deployment layer imports nothing of what it hooks in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from silofl.core.registry import Registry


class ArmedHook(Protocol):
    """A hook armed at one site for one run: called around every step the site runs."""

    def before(self, step: str, request: Any) -> None:
        """Before the site runs ``step`` on ``request``."""

    def after(self, step: str, request: Any, reply: Any) -> None:
        """After it answered ``reply``."""


@dataclass(frozen=True)
class SiteHook:
    """A site hook: armed when ``marker`` (a path inside the site's folder) exists, by ``arm(folder, site,
    index)`` once the run's site is built; ``rejoins``: whether an armed site may rejoin a run it was lost
    from (a hook whose evidence starts with the run may not)."""

    marker: str
    arm: Callable[[Path, Any, int], ArmedHook]
    rejoins: bool = False


SITE_HOOKS: Registry[SiteHook] = Registry("site hook", "silofl.site_hooks")


def hooks_for(folder: Path) -> list[tuple[str, SiteHook]]:
    """The registered hooks whose marker the site's ``folder`` holds, by name."""
    return [
        (name, e.obj) for name, e in SITE_HOOKS.entries().items() if (Path(folder) / e.obj.marker).is_file()
    ]
