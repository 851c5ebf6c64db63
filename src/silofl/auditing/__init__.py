"""``silofl audit``: what the shared artifacts actually leak.

Every ε silofl prints is an upper bound from an accountant. An audit measures the other side: it trains
the chosen method with *m canaries* at one audited site — each included independently with
probability ½ — scores every canary from what leaves the site, and turns the guesses into a one-run
empirical **lower bound** on ε at the run's δ (Steinke, Nasr & Jagielski 2023;
:mod:`silofl.auditing.one_run`). It also attacks real examples with membership inference (loss-based,
offline LiRA and RMIA with reference models; :mod:`silofl.auditing.attacks`).

Three kinds of audit, one folder layout (:mod:`silofl.auditing.report`):

* example-level methods (:mod:`silofl.auditing.example`): mislabelled canary examples in one site's data,
  scored from the shared models it releases every round and the last one;
* client-level methods (:mod:`silofl.auditing.clients`): canary *clients* (the privacy unit is a client),
  scored from the server's global model after every round;
* example-level methods with white-box *gradient* canaries (:mod:`silofl.auditing.gradient`, ``--canary-kind
  dirac | random``): canary gradients added inside the audited site's DP step, scored from every step's noisy
  gradient and from every release, with the Steinke et al. bound beside a Gaussian-pair estimate
  (:mod:`silofl.auditing.gauss`);
* PubSub-ML published models (:mod:`silofl.auditing.published`): canary examples in a publisher's data,
  scored from the published model.
"""

from __future__ import annotations

from pathlib import Path

from silofl.auditing.settings import AuditSettings
from silofl.core.errors import ConfigError

__all__ = ["AuditSettings", "check_engine", "run_audit"]

THREAT_MODELS = {  # the threat model of each kind of audit's bound (gradient canaries: auditing.gradient)
    "example-level": "black-box per release (query access to every model the site released, the last among "
    "them)",
    "client-level": "white-box per release (the parameters of every global model the server broadcast)",
    "pubsub": "black-box final model (query access to the published model)",
}


ENGINES = ("simulator", "flower-local")  # silofl audit --engine; torch.distributed: silofl launch … audit


def check_engine(
    cfg, settings: AuditSettings, processes: int | None = None, engine: str = "torch.distributed"
) -> None:
    """Refuse, before any process starts, an audit that cannot run on an engine other than the simulator:
    there only white-box gradient canaries of an example-level DP-SGD method are audited. Over
    torch.distributed their observer sits at the engine seam and reads the audited site, which must run in
    the coordinator's process — process 0, where client k runs on process k mod ``processes``; in a Flower
    deployment the audited site arms and observes itself (:class:`silofl.auditing.gradient.SiteAudit`)."""
    from silofl.auditing.gradient import GRADIENT_KINDS, audited_site

    if settings.pubsub_model is not None or cfg.resolve().is_client_level:
        raise ConfigError(
            f"over {engine}, silofl audit takes example-level methods (not client-level ones or "
            "--pubsub-model): audit this run on the simulator"
        )
    if settings.canary_kind not in GRADIENT_KINDS:
        raise ConfigError(
            f"over {engine}, silofl audit takes white-box gradient canaries: --canary-kind "
            + " | ".join(GRADIENT_KINDS)
        )
    audited = audited_site(cfg, settings)
    if processes is not None and audited % processes != 0:
        raise ConfigError(
            f"--audited-site {audited} runs on process {audited % processes} of {processes}: the audited "
            "site must run on process 0 (client k runs on process k mod the processes; site 0 always does)"
        )


def run_audit(
    cfg,
    settings: AuditSettings,
    out: str | Path,
    overwrite: bool = False,
    progress: bool = False,
    console=None,
    command: str | None = None,
    engine_factory=None,
    engine: str = "simulator",
) -> dict:
    """Run the audit ``settings`` asks for on ``cfg`` (a RunConfig) and write ``out``; returns audit.json's
    content. ``command``: the command line that asked for it (recorded in audit.json). ``engine_factory``
    (default: the simulator) makes the audited run's engine from its site factory, as
    :func:`silofl.runner.loop.run`'s does — the torch.distributed engine on process 0 of ``silofl launch …
    audit`` (gradient canaries only, :func:`check_engine`). ``engine`` ``flower-local``: the audited run is a
    local Flower deployment (``silofl deploy local``; gradient canaries only)."""
    import time

    from silofl.auditing import report
    from silofl.auditing.gradient import GRADIENT_KINDS

    settings.validate()
    if engine not in ENGINES:
        raise ConfigError(
            f"silofl audit runs on the engines {', '.join(ENGINES)} (torch.distributed: silofl launch … "
            f"audit), not {engine!r}"
        )
    if engine_factory is not None:
        check_engine(cfg, settings)
    if engine != "simulator":
        check_engine(cfg, settings, engine=engine)
    if settings.attacks:  # extra attacks (--attack): each says up front whether it applies to this audit
        from silofl.auditing.settings import AUDIT_ATTACKS

        kind = (
            "pubsub"
            if settings.pubsub_model is not None
            else "client-level"
            if cfg.resolve().is_client_level
            else "example-level"
        )
        for name in settings.attacks:
            AUDIT_ATTACKS.get(name).check(cfg, settings, kind)
    out = Path(out)
    report.check_out(out, overwrite)
    if overwrite:
        report.clear(out)
    t0 = time.perf_counter()
    if settings.pubsub_model is not None and settings.canary_kind in GRADIENT_KINDS:
        from silofl.auditing import gradient

        audit, extra = gradient.audit_published(cfg, settings)
    elif settings.pubsub_model is not None:
        from silofl.auditing import published

        audit, extra = published.audit(cfg, settings)
    elif cfg.resolve().is_client_level:
        from silofl.auditing import clients

        audit, extra = clients.audit(cfg, settings, out, progress=progress, console=console)
    elif engine == "flower-local":
        from silofl.auditing import deployed

        audit, extra = deployed.audit_deployed(cfg, settings, out, progress=progress, console=console)
    elif settings.canary_kind in GRADIENT_KINDS:
        from silofl.auditing import gradient

        audit, extra = gradient.audit(
            cfg, settings, out, progress=progress, console=console, engine_factory=engine_factory
        )
    else:
        from silofl.auditing import example

        audit, extra = example.audit(cfg, settings, out, progress=progress, console=console)
    audit.setdefault("seconds", {})["total"] = time.perf_counter() - t0
    # what the bound measures: the auditor's view of the run (gradient audits set their own)
    audit.setdefault("threat_model", THREAT_MODELS.get(audit["kind"], "black-box final model"))
    audit.setdefault("certifiable_epsilon_max", audit["bound"].get("certifiable_epsilon_max"))
    audit["command"] = command
    report.write(out, audit, extra["canary_scores"], extra["included"], extra["curves"], extra["split"])
    return audit
