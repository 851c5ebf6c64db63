"""The one place that says what a privacy mode means for a method and whether its ε is a formal
guarantee.

A method is described here only by its traits (:class:`MethodTraits`): whether its sites train a
private model by mutual learning with the shared one, whether it protects examples or whole clients,
whether it pools every site's data (Joint). ``mode`` is the user's ``--privacy`` choice.

* ``off`` — no DP; nothing printed is a guarantee.
* ``strict`` — example-level DP-SGD on a shared model whose per-example gradients depend on that
  example alone (β = 0): a formal (ε, δ) guarantee for everything that leaves the site.
* ``paper`` — mutual learning with β > 0: the shared model distils from the private model, a
  non-private function of the whole local data set, so DP-SGD's sensitivity bound fails and the ε
  printed is NOT a guarantee. For a method without mutual learning there is no β, so ``paper``
  resolves to ``strict`` (:func:`effective_mode`) and its ε is formal.
* client-level methods: the server adds the noise (central DP) and ε bounds one client (or one
  sub-client) — formal whenever DP is on; with secure aggregation the hospitals add distributed discrete noise
  and the ε against the server is reported apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from silofl.core.errors import ConfigError

PRIVACY_MODES = ("strict", "paper", "off")

NOTES = {
    "strict": "formal (ε, δ)-DP guarantee for each client's proxy and everything derived from it "
    "(β = 0: the proxy's per-example gradients depend only on that example and its label)",
    "paper": "NOT a formal guarantee: with β > 0 the proxy distils from the private model, a non-private "
    "function of the whole local data set, so DP-SGD's sensitivity bound does not hold; ε is what the "
    "accountant reports for the DP-SGD mechanism alone",
    "off": "no differential privacy: the shared model is trained without clipping or noise",
    "client": "formal client-level (ε, δ)-DP guarantee for one {unit} (all of its records at once) for the "
    "global "
    "model and everything the server releases; the server is trusted to add the noise (central DP)",
    "client_secure": "formal client-level (ε, δ)-DP guarantee for one {unit} (all of its records at once) "
    "for the global model and everything the server releases; with secure aggregation each hospital adds its "
    "share of discrete noise before masking, so the server sees only the noisy sum, and the ε that holds "
    "against the server is reported on its own (epsilon_vs_server)",
    "single": "formal (ε, δ)-DP guarantee for each client's DP model (DP-SGD on its own loss; the privacy "
    "mode's β does not apply to a method without mutual learning)",
}


@dataclass(frozen=True)
class MethodTraits:
    """What the privacy reasoning needs to know about a method."""

    mutual_learning: bool = False  # sites distil a private model and the shared one from each other
    level: str = "example"  # "example": DP-SGD per site; "client": clipped updates + server noise
    pooled: bool = False  # one model on every site's data at once (Joint)
    nonprivate: bool = False  # the method is a non-private variant (privacy forced off)


SEEDED_NOTE = (
    "seeded research run: noise and sampling come from the run seed, so this holds only while the seed "
    "stays secret — not a formal guarantee"
)


@dataclass(frozen=True)
class Guarantee:
    """What the ε a run prints means."""

    mode: str  # the effective privacy mode
    formal: bool
    note: str
    unit: str  # what one unit of protection is
    seeded: bool = False


def effective_mode(mode: str, traits: MethodTraits) -> str:
    """The privacy mode a method really runs under (idempotent: effective_mode(effective_mode(m)) == it)."""
    if mode not in PRIVACY_MODES:
        raise ConfigError(f"unknown privacy {mode!r}; choose one of: {', '.join(PRIVACY_MODES)}")
    if traits.nonprivate or mode == "off":
        return "off"
    if mode == "paper" and not traits.mutual_learning:
        return "strict"  # no β without mutual learning: paper mode changes nothing, the ε stays formal
    return mode


def guarantee(
    mode: str,
    traits: MethodTraits,
    privacy_unit: str = "hospital",
    seeded: bool = False,
    secure_aggregation: bool = False,
) -> Guarantee:
    """The guarantee behind the ε of a run of a method with ``traits`` under ``mode``; a seeded research run's
    is not formal (whoever knows the seed can reproduce its noise and sampling). With ``secure_aggregation`` a
    client-level method's noise is the hospitals' own, not the server's."""
    g = _guarantee(mode, traits, privacy_unit, secure_aggregation)
    if not seeded or g.mode == "off":
        return g
    return Guarantee(g.mode, False, f"{g.note}. {SEEDED_NOTE}", g.unit, seeded=True)


def _guarantee(mode: str, traits: MethodTraits, privacy_unit: str, secure: bool = False) -> Guarantee:
    mode = effective_mode(mode, traits)
    if traits.level == "client":
        if mode == "off":
            return Guarantee(mode, False, NOTES["off"], "none (no DP)")
        return Guarantee(
            mode,
            True,
            NOTES["client_secure" if secure else "client"].format(unit=privacy_unit),
            f"one {privacy_unit} (client-level DP: all of its data at once)",
        )
    unit = (
        "one training example of the pooled data set (example-level DP)"
        if traits.pooled
        else "one training example of one client (example-level DP, per client)"
    )
    if mode == "off":
        return Guarantee(mode, False, NOTES["off"], unit)
    if not traits.mutual_learning:
        return Guarantee(mode, True, NOTES["single"], unit)
    return Guarantee(mode, mode == "strict", NOTES[mode], unit)
