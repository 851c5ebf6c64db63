"""White-box gradient canaries for example-level DP-SGD (Steinke, Nasr & Jagielski 2023, §7's white-box
setting).

The canaries are *gradients*, not examples: m vectors of norm C in the shared model's parameter space —
``dirac`` (one coordinate at the clip norm C, m distinct coordinates, so the canaries are exactly orthogonal)
or ``random`` (a random ±1/√s direction on s = min(1024, ·) coordinates, scaled to norm C), drawn on the
model's largest parameter tensor and fixed before the run — each included with probability ½ (the audit's
secret coins). At every DP-SGD step of the audited site, each included canary is sampled like a real example
(independently with the site's Poisson rate q, from the audit's own generator) and the sampled ones are added
to the clipped per-example sum *before* the noise (:attr:`silofl.privacy.DPGradient.canaries`): a canary is an
example whose clipped gradient is its vector. The site's n, q, σ, C and step count — the accountant's inputs —
are unchanged; the gradient is still divided by the site's expected batch size q·n.

**Placement** (``--canary-placement``). ``quiet`` (the default): on the pool's coordinates where the real
examples' gradients are smallest — the mean over public mini-batches of the squared mean-loss gradient, at
the initial model and two re-initialisations of its architecture (:func:`activity_on_public_data`), on
public rows: training rows no client holds (:func:`public_rows`; for a publisher, rows it does not hold).
Random placement put canaries where the data's own gradient summed over the steps was as large as the canary
(a no-DP control's per-step canary AUC was 0.80); on quiet coordinates a canary's score is its own sampling
plus the mechanism's noise. The choice reads nothing of the audited site's data and is made before the run,
independently of the coins, so the SNJ bound stays valid. ``random``: anywhere on the pool (the fallback
where the sites' inputs are not the data set's rows as they are).

Scores (higher: more likely included), one per threat model:

* **white-box per step** — the auditor sees every step's noisy gradient g̃_t (the optimizer's input): Σ_t
  ⟨g̃_t, u_i⟩ · q·n / C, with u_i the canary's unit direction. Each step contributes N(0, σ²) noise, +1 when
  the canary was sampled, and the (small) projection of the real examples' clipped gradients;
* **white-box per release** — the auditor sees the shared models the site releases (the observer at the engine
  seam, :mod:`silofl.auditing.tap`): −Σ_rounds ⟨θ_released − θ_start, u_i⟩ / lr (the site descends along a
  canary it sampled). Methods in which nothing leaves a site (Regular, Joint) are scored on the site's shared
  model after each round, as if it were released.

Without DP (the no-DP control) there is no mechanism to hook: the sampled canaries are added to the plain mean
gradient, with the same weight 1/(q·n), just before the optimizer steps (an optimizer step pre-hook, which
also reads the per-step score in both cases). Input-space canaries (:mod:`silofl.auditing.example`) stay the
black-box option.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

from silofl.auditing import gauss, one_run
from silofl.auditing.bound import one_run_bound
from silofl.auditing.example import run_config
from silofl.auditing.settings import AuditSettings
from silofl.auditing.tap import TappedEngine, model_tensors, released_by, tap
from silofl.comm.engine import Engine, InProcessEngine
from silofl.comm.messages import Message
from silofl.core.errors import ConfigError
from silofl.deploy.hooks import SITE_HOOKS, SiteHook
from silofl.runner.config import RunConfig
from silofl.runner.data import unheld_rows
from silofl.runner.loop import RunHooks
from silofl.runner.loop import run as run_loop

GRADIENT_KINDS = ("dirac", "random")
SUPPORT = 1024
TRAIN_STEPS = ("train_send", "train_upload", "train")
PER_STEP, PER_RELEASE, BLACK_BOX = "white-box per step", "white-box per release", "black-box final model"
WHITE_FINAL = "white-box final model"


def describe(kind: str, d: int, pool: int) -> str:
    """audit.json's ``canaries.kind`` for a gradient canary kind (``pool``: coordinates they are drawn
    from)."""
    where = (
        f"the {pool} coordinates of the shared model's largest parameter tensor (of {d})"
        if pool < d
        else f"the shared model's {d} coordinates"
    )
    if kind == "dirac":
        return (
            f"Dirac gradient canaries: one coordinate at the clip norm C, m distinct coordinates among "
            f"{where}"
        )
    return (
        f"random-direction gradient canaries: a ±1/√s direction on s = {min(SUPPORT, pool)} of {where}, at "
        f"the "
        "clip norm C"
    )


class GradientCanaries:
    """m canary gradients on a model's trainable parameters, their coins, their Poisson sampling and their
    scores."""

    def __init__(
        self,
        params: list[nn.Parameter],
        m: int,
        kind: str,
        included: np.ndarray,
        sample_rate: float,
        seed: int,
        activity: np.ndarray | None = None,
    ):
        if kind not in GRADIENT_KINDS:
            raise ConfigError(
                f"unknown gradient canary kind {kind!r}; choose one of: {', '.join(GRADIENT_KINDS)}"
            )
        self.params = list(params)
        self.shapes = [p.shape for p in self.params]
        self.d = sum(p.numel() for p in self.params)
        self.m, self.kind, self.q = m, kind, float(sample_rate)
        # the canaries live on the largest parameter tensor (the first layer of an MLP), fixed before the run:
        # its coordinates carry the least real-gradient signal each, so the canary stands out of the noise (on
        # small layers and biases the real examples' clipped gradients pile up)
        sizes = [p.numel() for p in self.params]
        big = int(np.argmax(sizes))
        lo = sum(sizes[:big])
        self.pool = (lo, lo + sizes[big]) if sizes[big] >= m else (0, self.d)
        n_pool = self.pool[1] - self.pool[0]
        if kind == "dirac" and m > n_pool:
            raise ConfigError(
                f"{m} Dirac canaries need {m} distinct coordinates; the shared model has {self.d}"
            )
        rng_dirs, rng_sample = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
        # placement ("quiet", given ``activity``): the candidates are the pool's coordinates where the real
        # examples' gradients move least (:func:`activity_on_public_data`), ties broken at random; else the
        # whole pool ("random")
        self.placement = "random" if activity is None else "quiet"
        candidates = np.arange(n_pool)
        if activity is not None:
            act = np.asarray(activity, float).reshape(-1)
            if act.shape != (self.d,):
                raise ValueError(f"activity needs one value per coordinate ({self.d}), got {act.shape}")
            keep = m if kind == "dirac" else min(n_pool, max(SUPPORT, m))
            order = np.lexsort((rng_dirs.random(n_pool), act[self.pool[0] : self.pool[1]]))
            candidates = np.sort(order[:keep])
        if kind == "dirac":
            picked = (
                rng_dirs.choice(n_pool, size=m, replace=False)
                if activity is None
                else rng_dirs.permutation(candidates)
            )
            support = self.pool[0] + picked[:, None]
            values = np.ones((m, 1))
        else:
            s = min(SUPPORT, len(candidates))
            support = np.stack(
                [self.pool[0] + rng_dirs.choice(candidates, size=s, replace=False) for _ in range(m)]
            )
            values = rng_dirs.choice([-1.0, 1.0], size=(m, s)) / math.sqrt(s)
        self.activity = (
            None if activity is None else float(np.asarray(activity, float).reshape(-1)[support].mean())
        )
        device = self.params[0].device
        self.support = torch.as_tensor(support, dtype=torch.long, device=device)
        self.values = torch.as_tensor(values, dtype=torch.float32, device=device)  # rows of unit norm
        self.included = np.asarray(included, bool)
        if self.included.shape != (m,):
            raise ValueError("one coin per canary")
        self.sampler = rng_sample
        self.step_scores = np.zeros(m)
        self.sampled = np.zeros(m, dtype=np.int64)  # how often each canary joined a step (0 if excluded)
        self.steps = 0
        self.scale = 1.0  # q·n / C: a step's score in units of one canary (set by attach)
        self.plain_weight: float | None = None  # without DP: 1 / (q·n), the weight of an example in the mean

    # ------------------------------------------------------------------ the vectors
    def flat(self, mask: np.ndarray, norm: float) -> torch.Tensor:
        """Σ over canaries in ``mask`` of norm · u_i, as one flat vector."""
        v = torch.zeros(self.d, dtype=torch.float32, device=self.values.device)
        idx = torch.as_tensor(np.flatnonzero(mask), dtype=torch.long, device=self.values.device)
        if len(idx):
            v.index_add_(0, self.support[idx].reshape(-1), (self.values[idx] * norm).reshape(-1))
        return v

    def pieces(self, v: torch.Tensor) -> list[torch.Tensor]:
        """A flat vector cut into the parameters' shapes."""
        out, at = [], 0
        for shape in self.shapes:
            k = math.prod(shape)
            out.append(v[at : at + k].view(shape))
            at += k
        return out

    def project(self, v: torch.Tensor) -> np.ndarray:
        """⟨v, u_i⟩ for every canary."""
        return (v[self.support] * self.values).sum(1).double().cpu().numpy()

    def draw(self) -> np.ndarray:
        """This step's Poisson draw: which canaries join it (only included ones can)."""
        mask = (self.sampler.random(self.m) < self.q) & self.included
        self.sampled += mask
        return mask

    # ------------------------------------------------------------------ the hooks
    def add(self, grads: dict, params: list[nn.Parameter], clip: float) -> dict:
        """DPGradient's hook: the sampled canaries (each of norm ``clip``) join the clipped sum before the
        noise."""
        if len(params) != len(self.params) or any(
            a is not b for a, b in zip(params, self.params, strict=True)
        ):
            raise RuntimeError("the canaries were drawn for another model's parameters")
        v = self.flat(self.draw(), clip)
        out = dict(grads)
        for p, piece in zip(params, self.pieces(v), strict=True):
            g = out.get(p)
            piece = piece.to(device=p.device, dtype=p.dtype)
            out[p] = piece.clone() if g is None else g.detach() + piece
        return out

    def before_step(self, clip: float) -> None:
        """The optimizer's step pre-hook: without DP add the sampled canaries to the mean gradient; then read
        the step's (noisy) gradient along every canary."""
        if self.plain_weight is not None:
            v = self.flat(self.draw(), clip * self.plain_weight)
            for p, piece in zip(self.params, self.pieces(v), strict=True):
                piece = piece.to(device=p.device, dtype=p.dtype)
                p.grad = piece.clone() if p.grad is None else p.grad.add_(piece)
        g = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float()
                for p in self.params
            ]
        )
        self.step_scores += self.project(g) * self.scale
        self.steps += 1

    def flat_state(self, state: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
        """The trainable parameters of a state dict, flat, in the canaries' order."""
        return torch.cat([state[n].detach().reshape(-1).float().to(self.values.device) for n in names])


PUBLIC_ROWS = 2000  # public examples the placement reads (batches of the site's expected batch size)


def public_rows(split: Any, seed: int, limit: int = PUBLIC_ROWS) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Up to ``limit`` rows of the data set's training split that no client trains on — what an auditor may
    know of the data without the audited site's — or None where the sites' inputs are not those rows as they
    are (per-site preprocessing, a feature stage) or none are left."""
    ds = split.dataset
    if split.indices is None or split.features is not None or split.preprocessing is not None:
        return None
    if split.external is not None or not split.parts or ds.x_train.shape[1:] != split.parts[0][0].shape[1:]:
        return None
    rows = pick_public(unheld_rows(len(ds.y_train), split.indices), seed, limit)
    if rows is None:
        return None
    sel = torch.as_tensor(rows)
    return ds.x_train[sel], ds.y_train[sel]


def pick_public(free: np.ndarray, seed: int, limit: int = PUBLIC_ROWS) -> np.ndarray | None:
    """Up to ``limit`` of the row indices ``free``, drawn with ``seed``, ascending; None for fewer than
    two."""
    if len(free) < 2:
        return None
    return np.sort(np.random.default_rng(seed).permutation(free)[:limit])


def quiet_activity(model: nn.Module, public: Any, sample_rate: float, n: int) -> np.ndarray | None:
    """:func:`activity_on_public_data` of ``model`` on ``public`` rows (x, y) in batches of the site's
    expected batch size q·n; None without public rows (random placement)."""
    if public is None:
        return None
    return activity_on_public_data(model, public[0], public[1], batch=round(sample_rate * n))


def activity_on_public_data(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, inits: int = 3
) -> np.ndarray | None:
    """Per coordinate of ``model``'s trainable parameters, the mean over public mini-batches (of the site's
    expected batch size) of the squared mean-loss gradient, averaged over the model's initial weights and
    ``inits`` − 1 fresh initialisations of the same architecture (a hidden unit that happens to be dead at one
    initialisation is not quiet for the whole run; an input that is never on is): how much the real examples
    move each coordinate. On copies, with the global RNG restored (a run without canaries stays
    bit-identical); None if the model's outputs are not class scores for ``y``."""
    import copy

    import torch.nn.functional as F

    device = next(model.parameters()).device
    batch = max(1, min(int(batch), len(y)))
    total: torch.Tensor | None = None
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for k in range(max(1, inits)):
            twin = copy.deepcopy(model).to(device)
            if k:
                torch.manual_seed(k)
                for mod in twin.modules():
                    reset = getattr(mod, "reset_parameters", None)
                    if callable(reset):
                        reset()
            twin.eval()  # no dropout noise in the placement
            params = [p for p in twin.parameters() if p.requires_grad]
            acc = [torch.zeros_like(p) for p in params]
            n_b = 0
            for at in range(0, len(y) - batch + 1, batch):
                xb, yb = x[at : at + batch].to(device), y[at : at + batch].to(device)
                try:
                    loss = F.cross_entropy(twin(xb), yb)
                except (RuntimeError, ValueError, IndexError):
                    return None
                grads = torch.autograd.grad(loss, params, allow_unused=True)
                for a, g in zip(acc, grads, strict=True):
                    if g is not None:
                        a.add_(g.detach() ** 2)
                n_b += 1
            if n_b == 0:
                return None
            flat = torch.cat([a.reshape(-1) for a in acc]).double() / n_b
            total = flat if total is None else total + flat
    assert total is not None
    return (total / max(1, inits)).cpu().numpy()


def placement_note(
    canaries: Any, public: Any, asked: str, whose: str = "training rows no client holds"
) -> str:
    """audit.json's words for where the canaries sit."""
    if canaries.placement == "quiet":
        return (
            f"the {canaries.m} coordinates of the pool where the real examples' mean gradient at the "
            f"initial model was smallest on {len(public[1])} public rows ({whose}; "
            f"mean squared batch gradient there {canaries.activity:.3g}), chosen before the run and "
            "independent of the coins"
        )
    if asked == "quiet":
        return (
            "quiet placement asked but not possible (no public rows in the sites' input form, or the model's "
            "outputs are not class scores): anywhere on the pool, at random"
        )
    return "anywhere on the pool, at random (--canary-placement random)"


def attach(site: Any, canaries: GradientCanaries) -> None:
    """Install ``canaries`` at a DP-SGD site: in its mechanism (DP) or on its plain gradient (no DP), and read
    every step through the shared optimizer's step pre-hook."""
    attach_to(site.dp, site.shared_opt, canaries, float(site.settings.clip), site.sample_rate * site.n)


def attach_to(
    dp: Any, opt: torch.optim.Optimizer, canaries: GradientCanaries, clip: float, expected: float
) -> None:
    """Install ``canaries`` in the mechanism ``dp`` (None: on the plain gradient, weight 1/``expected``) and
    read every step of ``opt``; ``expected`` is the mechanism's expected batch size q·n."""
    canaries.scale = expected / clip
    if dp is not None:
        dp.canaries = canaries
    else:
        canaries.plain_weight = 1.0 / expected
    opt.register_step_pre_hook(lambda o, args, kwargs: canaries.before_step(clip))


class ReleaseObserver:
    """At the engine seam: −⟨θ_released − θ_start, u_i⟩ / lr summed over the audited site's training
    rounds."""

    def __init__(self, site: int):
        self.site = site
        self.canaries: GradientCanaries | None = None
        self.names: list[str] = []
        self.lr = 1.0
        self.start: torch.Tensor | None = None
        self.scores: np.ndarray | None = None
        self.releases = 0
        self.trained = 0
        self.records: list[dict] = []  # per round: what was seen (for comparing engines)

    def before(self, step: str, requests: dict[int, Message], engine: TappedEngine) -> None:
        """θ_start: the shared model the audited site starts the round from."""
        if self.canaries is not None and step in TRAIN_STEPS and self.site in requests:
            site: Any = engine.sites[self.site]
            self.start = self.canaries.flat_state(site.shared_state(), self.names)

    def after(
        self, step: str, requests: dict[int, Message], replies: dict[int, Message], engine: TappedEngine
    ) -> None:
        """θ_released: what left the site (or its shared model when nothing does)."""
        if self.canaries is None or step not in TRAIN_STEPS or self.site not in replies or self.start is None:
            return
        site: Any = engine.sites[self.site]
        packets = released_by(self.site, replies)
        state = model_tensors(packets[0]) if packets else site.shared_state()
        self.releases += bool(packets)
        self.trained += 1
        delta = self.canaries.flat_state(state, self.names) - self.start
        s = -self.canaries.project(delta) / self.lr
        self.scores = s if self.scores is None else self.scores + s
        self.records.append(
            {
                "round": int(requests[self.site].meta.get("round", self.trained)),
                "released": bool(packets),
                "delta_norm": float(delta.norm()),
                "score_sum": float(s.sum()),
            }
        )
        self.start = None


def bounds_for(
    scores: np.ndarray, included: np.ndarray, delta: float, confidence: float, seed: int, threat_model: str
) -> dict:
    """SNJ's one-run bound and the Gaussian-pair estimate for one threat model's scores."""
    name = {PER_STEP: "steps", PER_RELEASE: "releases"}.get(threat_model, "final")
    snj = one_run_bound({name: scores}, included, delta, confidence, seed)
    return {
        "threat_model": threat_model,
        "score": name,
        "snj": snj,
        "gauss": gauss.gauss_estimate(scores, included, delta, confidence),
    }


def coins_for(s: AuditSettings) -> np.ndarray:
    """Which of the m canaries are in (each with probability ½), drawn from the audit's seed."""
    return np.random.default_rng(s.derived(1)).random(s.canaries) < 0.5


def audited_site(cfg: RunConfig, s: AuditSettings) -> int:
    """The site that gets the canaries: ``s.site``, or site 0 where one site holds everyone's data."""
    return 0 if cfg.info.traits.pooled else s.site


def audit(
    cfg: RunConfig,
    s: AuditSettings,
    out: Path,
    progress: bool = False,
    console=None,
    engine_factory: Callable[[Callable[[int], Any], int], Engine] | None = None,
) -> tuple[dict, dict]:
    """Run ``cfg`` with gradient canaries at site ``s.site``; (audit.json content, plot/CSV material).
    ``engine_factory`` (default: the simulator) makes the engine from the site factory — e.g. the
    torch.distributed engine on rank 0, where the audited site must live (site 0 always does)."""
    cfg = run_config(cfg, s, out)
    audited = audited_site(cfg, s)
    coins = coins_for(s)
    held: dict = {}

    def keep_public(run_cfg: RunConfig, split: Any) -> Any:
        held["public"] = public_rows(split, s.derived(3)) if s.canary_placement == "quiet" else None
        return split

    def factory(make, n_sites):
        engine: Any = (
            InProcessEngine({k: make(k) for k in range(n_sites)})
            if engine_factory is None
            else engine_factory(make, n_sites)
        )
        if audited not in getattr(engine, "sites", {}):
            raise ConfigError(
                f"site {audited} does not run in this process: the audited site must (site 0 does)"
            )
        site: Any = engine.sites[audited]
        canaries, observer = arm(
            site, audited, cfg.method, s.canaries, s.canary_kind, coins, s.derived(2), held.get("public")
        )
        held.update(site=site, canaries=canaries, observer=observer)
        engine.name = f"{engine.name} (audited)"
        return tap(engine, [observer])

    t0 = time.perf_counter()
    summary = run_loop(
        cfg, progress=progress, console=console, engine_factory=factory, hooks=RunHooks(split=keep_public)
    )
    run_s = time.perf_counter() - t0
    evidence = Evidence.of(held["site"], held["canaries"], held["observer"])
    return report(cfg, s, evidence, coins, summary, held.get("public"), run_s)


def arm(
    site: Any, index: int, method: str, m: int, kind: str, coins: np.ndarray, seed: int, public: Any
) -> tuple[GradientCanaries, ReleaseObserver]:
    """Put ``m`` gradient canaries (``coins``: which are in) in DP-SGD site ``index``'s mechanism, placed
    quietly on ``public`` rows (None: at random), with an observer that scores what the site releases."""
    if not all(hasattr(site, a) for a in ("shared", "shared_opt", "dp", "sample_rate")):
        raise ConfigError(f"{method}'s sites do not train by DP-SGD: gradient canaries need a DP-SGD site")
    params = [p for p in site.shared.parameters() if p.requires_grad]
    activity = quiet_activity(site.shared, public, site.sample_rate, site.n)
    canaries = GradientCanaries(params, m, kind, coins, site.sample_rate, seed, activity=activity)
    attach(site, canaries)
    observer = ReleaseObserver(index)
    observer.canaries = canaries
    observer.names = [n for n, p in site.shared.named_parameters() if p.requires_grad]
    observer.lr = float(site.settings.lr)
    return canaries, observer


@dataclasses.dataclass
class Evidence:
    """What the audited site's canaries and observer recorded in a run: all that audit.json needs of it (a
    deployed site writes it to its folder, :class:`SiteAudit`)."""

    step_scores: np.ndarray  # per canary: Σ over DP steps of the noisy gradient along it (· q·n / C)
    release_scores: np.ndarray | None  # per canary: −Σ over rounds of the released movement along it / lr
    records: list[dict]  # per round: what the observer saw
    releases: int  # rounds in which something left the site
    trained: int  # rounds the site trained
    steps: int  # DP steps
    q: float  # the site's sampling rate
    sampled: np.ndarray  # how often each canary joined a step
    m: int
    d: int  # coordinates of the shared model
    pool: tuple[int, int]  # the coordinates the canaries were drawn from
    placement: str  # quiet | random
    activity: float | None  # quiet placement: the real gradients' mean square at the chosen coordinates
    private: bool  # the site trains with DP
    sigma: float  # its noise multiplier (0 without DP)
    epsilon: float | None  # its accountant's ε after the run
    n: int  # its real examples

    @classmethod
    def of(cls, site: Any, canaries: GradientCanaries, observer: ReleaseObserver) -> Evidence:
        """Read from the audited site and its canaries and observer after the run."""
        private = site.dp is not None
        return cls(
            step_scores=canaries.step_scores.copy(),
            release_scores=None if observer.scores is None else observer.scores.copy(),
            records=list(observer.records),
            releases=observer.releases,
            trained=observer.trained,
            steps=canaries.steps,
            q=canaries.q,
            sampled=canaries.sampled.copy(),
            m=canaries.m,
            d=canaries.d,
            pool=canaries.pool,
            placement=canaries.placement,
            activity=canaries.activity,
            private=private,
            sigma=float(site.settings.noise_multiplier) if private else 0.0,
            epsilon=site.epsilon(),
            n=int(site.n),
        )

    def to_json(self) -> dict:
        """As JSON (arrays as lists)."""
        out = dataclasses.asdict(self)
        for k in ("step_scores", "release_scores", "sampled"):
            out[k] = None if out[k] is None else np.asarray(out[k]).tolist()
        out["pool"] = list(self.pool)
        return out

    @classmethod
    def from_json(cls, d: Any) -> Evidence:
        """Read back what :meth:`to_json` wrote, checked (a site's folder is read here)."""
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(d, dict) or set(d) != names:
            raise ConfigError("the audited site's evidence.json is not what silofl writes")
        try:
            m = int(d["m"])
            ev = cls(
                **{
                    **d,
                    "step_scores": np.asarray(d["step_scores"], dtype=float),
                    "release_scores": None
                    if d["release_scores"] is None
                    else np.asarray(d["release_scores"], dtype=float),
                    "sampled": np.asarray(d["sampled"], dtype=np.int64),
                    "pool": (int(d["pool"][0]), int(d["pool"][1])),
                }
            )
        except (TypeError, ValueError, IndexError, KeyError) as e:
            raise ConfigError(f"the audited site's evidence.json is malformed: {e}") from None
        shapes = [ev.step_scores.shape, ev.sampled.shape]
        if ev.release_scores is not None:
            shapes.append(ev.release_scores.shape)
        if any(sh != (m,) for sh in shapes) or not isinstance(ev.records, list):
            raise ConfigError("the audited site's evidence.json does not hold one score per canary")
        return ev


def report(
    cfg: RunConfig,
    s: AuditSettings,
    ev: Evidence,
    coins: np.ndarray,
    summary: dict,
    public: Any,
    run_s: float,
) -> tuple[dict, dict]:
    """audit.json's content and the plot/CSV material from a gradient-canary run's evidence."""
    if ev.steps == 0 or ev.release_scores is None:
        raise ConfigError("the audited site never trained: nothing to audit (raise --rounds or the budget)")
    resolved = cfg.resolve()
    private = ev.private
    delta = resolved.delta if private else 1e-5
    beta = 1.0 - s.confidence
    scores = {"steps": ev.step_scores.copy(), "releases": ev.release_scores.copy()}
    by_threat = {
        PER_STEP: bounds_for(scores["steps"], coins, delta, s.confidence, s.derived(0), PER_STEP),
        PER_RELEASE: bounds_for(scores["releases"], coins, delta, s.confidence, s.derived(0), PER_RELEASE),
    }
    head = by_threat[PER_STEP]
    sigma = ev.sigma
    T, q = ev.steps, ev.q
    eps_acc = ev.epsilon
    mech = dataclasses.replace(resolved, seed=None).guarantee()
    g = resolved.guarantee()
    notes = _notes(cfg, s, ev, mech)
    mu_expected = q * math.sqrt(T) / sigma if sigma > 0 else None
    audit_json = {
        "kind": "example-level",
        "title": f"{cfg.method} ({resolved.privacy}) on {resolved.dataset}, site {s.site}, gradient canaries",
        "research_note": s.research_note,
        "seed": s.seed,
        "method": cfg.method,
        "privacy_mode": resolved.privacy,
        "formal_guarantee": bool(mech.formal) if private else False,
        "seeded": s.seeded,
        "guarantee_note": g.note,
        "unit": g.unit,
        "threat_model": PER_STEP,
        "epsilon_lower_bound": head["snj"]["epsilon_lower_bound"],
        "epsilon_gauss": head["gauss"]["epsilon_estimate"],
        "epsilon_gauss_unbounded": head["gauss"]["epsilon_estimate_unbounded"],
        "confidence": s.confidence,
        "epsilon_accountant": eps_acc,
        "accountant": summary["privacy"]["accountant"],
        "delta": delta,
        "noise_multiplier": sigma if private else None,
        "sample_rate": q,
        "steps": T,
        "rounds": summary["rounds_run"],
        "bound": head["snj"],
        "bounds": by_threat,
        "certifiable_epsilon_max": one_run.max_auditable_eps(s.canaries, s.canaries, delta, beta),
        "mu_sum_statistic_expected": mu_expected,
        "canaries": {
            "m": s.canaries,
            "included": int(coins.sum()),
            "excluded": int((~coins).sum()),
            "inclusion_probability": 0.5,
            "kind": describe(s.canary_kind, ev.d, ev.pool[1] - ev.pool[0]),
            "canary_kind": s.canary_kind,
            "placement": ev.placement,
            "placement_note": placement_note(ev, public, s.canary_placement),
            "space": "gradient",
            "audited_site": s.site,
            "site_examples_real": ev.n,
            "mean_times_sampled_when_included": float(ev.sampled[coins].mean()) if coins.any() else 0.0,
            "scores": {
                "steps": "Σ_t ⟨g̃_t, u_i⟩ · q·n / C over every DP step's noisy gradient (white-box per step)",
                "releases": "−Σ_rounds ⟨θ_released − θ_start, u_i⟩ / lr (white-box per release)",
            },
            "releases_scored": ev.releases,
            "rounds_scored": ev.trained,
        },
        "observer_records": ev.records,
        "membership_inference": {
            "note": "gradient canaries audit the mechanism; membership inference on real "
            "examples runs with input-space canaries (--canary-kind mislabelled)",
            "targets": {},
        },
        "accuracy": {k: v for k, v in summary["final"].items() if k.endswith("_acc")},
        "engine": summary.get("engine"),
        "run_folder": "run",
        "seconds": {"run": run_s},
        "notes": notes,
    }
    split = {
        "canaries": [f"gradient-canary:{i}" for i in range(s.canaries)],
        "included": coins.astype(int).tolist(),
    }
    return audit_json, {"canary_scores": scores, "included": coins, "curves": {}, "split": split}


def _notes(cfg: RunConfig, s: AuditSettings, ev: Evidence, mech: Any) -> list[str]:
    """A gradient-canary audit's notes: how the canaries entered, which bound leads, what the mode means."""
    q, private = ev.q, ev.private
    notes = [
        f"gradient canaries ({s.canary_kind}) were added inside the audited site's DP step as extra clipped "
        f"per-example gradients, sampled at the site's q = {q:.4g}; the accountant's inputs (σ, q, steps) "
        "are the site's own, unchanged by them",
        "the headline bound is fixed in advance to the white-box per-step threat model; the per-release "
        "bound is reported beside it (each with its own Bonferroni correction over the guess counts)",
        "the Gaussian-pair figure (Agrawal et al.'s estimator, silofl.auditing.gauss) is an estimate under a "
        "Gaussian-scores assumption, not a guarantee like the SNJ bound; the paper's worked figures could "
        "not be reproduced here (its text with them was not available)",
    ]
    if not ev.releases:
        notes.append(
            f"nothing leaves a site in {cfg.method}: the site's shared model after each round was scored as "
            "if it were released"
        )
    if private and not mech.formal:
        notes.append(
            "the accountant's ε is NOT a formal guarantee in this mode (paper mode): a lower bound above it "
            "would be a measured violation, not a bug"
        )
    if not private:
        notes.append(
            "no DP: there is no accountant ε; the bounds are computed at δ = 1e-5 and the canaries were "
            "added to the plain mean gradient with weight 1/(q·n)"
        )
    return notes


AUDIT_DIR = "audit"  # in a deployed site's folder: the auditor's spec.json and public.npz; its evidence
SPEC_BYTES = 64 << 20  # the most of spec.json and evidence.json read (4000 canaries take about 0.2 MB)


class SiteAudit:
    """A deployed site auditing itself (``silofl audit --engine flower-local``): the auditor's gradient
    canaries in the site's own DP step, and an observer of what the site releases around every step it runs
    (:meth:`before`, :meth:`after`). In a deployment the released proxies are sealed to their recipients, so
    the site is where what it releases can be read; it writes the evidence to ``FOLDER/audit/evidence.json``
    after every training step. The spec (``FOLDER/audit/spec.json``: m, kind, the coins, the canaries' seed)
    and the public rows of the quiet placement (``public.npz``) are the auditor's, put in the site's folder
    by whoever runs the site — a site is audited only where its operator placed them."""

    def __init__(self, folder: Path, site: Any, index: int):
        d = Path(folder) / AUDIT_DIR
        spec = read_spec(d / "spec.json")
        public = None
        if (d / "public.npz").is_file():
            with np.load(d / "public.npz", allow_pickle=False) as z:
                public = (
                    torch.as_tensor(z["x"], dtype=torch.float32),
                    torch.as_tensor(z["y"], dtype=torch.long),
                )
        self.canaries, self.observer = arm(
            site, index, spec["method"], spec["m"], spec["kind"], spec["included"], spec["seed"], public
        )
        self.site, self.index, self.path = site, index, d / "evidence.json"
        self.engine: Any = SimpleNamespace(sites={index: site})

    def before(self, step: str, request: Message) -> None:
        """Before the site runs ``step``: the shared model it starts from."""
        self.observer.before(step, {self.index: request}, self.engine)

    def after(self, step: str, request: Message, reply: Message) -> None:
        """After: what it released; after a training step, the evidence so far, written whole."""
        self.observer.after(step, {self.index: request}, {self.index: reply}, self.engine)
        if step in TRAIN_STEPS:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(Evidence.of(self.site, self.canaries, self.observer).to_json()))
            os.replace(tmp, self.path)


def read_json(path: Path, what: str) -> Any:
    """A JSON file of a site's audit folder, its size bounded before it is read."""
    if path.stat().st_size > SPEC_BYTES:
        raise ConfigError(f"{path} is over {SPEC_BYTES >> 20} MB: not {what}")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ConfigError(f"{path} is not {what}: {e}") from None


def read_spec(path: Path) -> dict:
    """An audit spec, checked: m canaries, their kind, one coin each, the canaries' seed, the method."""
    spec = read_json(path, "an audit spec")
    try:
        m, kind, seed, method = spec["m"], spec["kind"], spec["seed"], spec["method"]
        included = spec["included"]
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"{path} is not an audit spec: {e}") from None
    if not (isinstance(m, int) and not isinstance(m, bool) and m > 0):
        raise ConfigError(f"{path}: m must be a positive whole number")
    if kind not in GRADIENT_KINDS:
        raise ConfigError(f"{path}: kind must be one of {', '.join(GRADIENT_KINDS)}")
    whole = isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0
    if not whole or not isinstance(method, str):
        raise ConfigError(f"{path}: seed must be a non-negative whole number and method a name")
    coins = isinstance(included, list) and len(included) == m and all(isinstance(c, bool) for c in included)
    if not coins:
        raise ConfigError(f"{path}: included must hold one true/false coin per canary")
    return {"m": m, "kind": kind, "seed": seed, "method": method, "included": np.asarray(included, bool)}


def audit_published(cfg: RunConfig, s: AuditSettings) -> tuple[dict, dict]:
    """Gradient canaries in PubSub-ML's published dp-nn (``silofl audit --pubsub-model dp-nn --canary-kind
    dirac``): the publisher's DP-SGD (:func:`silofl.pubsub.dp_models.train`, the code ``silofl pubsub
    publish`` runs) with the canaries installed through its ``dp_hook``; scored per step and from the
    published model's movement from its (data-independent) initialisation along each canary (white-box
    final model)."""
    import inspect

    from silofl.auditing.published import publisher_data
    from silofl.pubsub import dp_models

    cfg, nonprivate, split_seed, ds, x_train, x_test, rows, bounds = publisher_data(cfg, s)
    n = len(rows)
    defaults = inspect.signature(dp_models.train).parameters
    batch, clip, lr = (defaults[k].default for k in ("batch_size", "clip", "lr"))
    coins = coins_for(s)
    held: dict = {}
    public = None
    if s.canary_placement == "quiet":  # training rows the publisher does not hold, in the model's input form
        pick = pick_public(unheld_rows(len(ds.y_train), [rows]), s.derived(3))
        if pick is not None:
            public = (
                torch.as_tensor(bounds.scale(x_train[torch.as_tensor(pick)].numpy()), dtype=torch.float32),
                ds.y_train[torch.as_tensor(pick)],
            )

    def hook(dp, model, opt, n_rows):
        params = [p for p in model.parameters() if p.requires_grad]
        q = dp.sample_rate if dp is not None else min(1.0, batch / n_rows)
        activity = quiet_activity(model, public, q, n_rows)
        canaries = GradientCanaries(
            params, s.canaries, s.canary_kind, coins, q, s.derived(2), activity=activity
        )
        attach_to(dp, opt, canaries, float(dp.clip) if dp is not None else float(clip), q * n_rows)
        held.update(
            canaries=canaries,
            start=torch.cat([p.detach().reshape(-1).float().clone() for p in params]),
            params=params,
            dp=dp,
        )

    t0 = time.perf_counter()
    model = dp_models.train(
        "dp-nn",
        x_train[torch.as_tensor(rows)].numpy(),
        ds.y_train[torch.as_tensor(rows)].numpy(),
        publisher="audited",
        features=[f"x{i}" for i in range(x_train.shape[1])],
        task="classification",
        bounds=bounds,
        epsilon=s.epsilon if s.epsilon is not None else 1.0,
        delta=cfg.delta,
        classes=list(range(ds.num_classes)),
        seed=s.seed + 7 if s.seed is not None else None,
        nonprivate=nonprivate,
        epochs=s.pubsub_epochs,
        dp_hook=hook,
    )
    train_s = time.perf_counter() - t0
    canaries = held["canaries"]
    end = torch.cat([p.detach().reshape(-1).float() for p in held["params"]])
    scores = {"steps": canaries.step_scores.copy(), "final": -canaries.project(end - held["start"]) / lr}
    delta = 1e-5 if nonprivate else cfg.delta
    by_threat = {
        PER_STEP: bounds_for(scores["steps"], coins, delta, s.confidence, s.derived(0), PER_STEP),
        WHITE_FINAL: bounds_for(scores["final"], coins, delta, s.confidence, s.derived(0), WHITE_FINAL),
    }
    audit_json, split = _published_report(
        cfg, s, model, canaries, public, coins, by_threat, delta, n, split_seed, nonprivate, train_s
    )
    return audit_json, {"canary_scores": scores, "included": coins, "curves": {}, "split": split}


def _published_report(cfg, s, model, canaries, public, coins, by_threat, delta, n, split_seed, nonprivate, t):
    """(audit.json content, split) of a published dp-nn audited with gradient canaries; ``t``: seconds the
    publisher trained."""
    head = by_threat[PER_STEP]
    mech = model.mechanism
    sigma = float(mech["noise_multiplier"]) if not nonprivate else 0.0
    T, q = canaries.steps, canaries.q
    notes = [
        f"gradient canaries ({s.canary_kind}) were added inside the publisher's DP-SGD step (dp-nn) as extra "
        f"clipped per-example gradients sampled at its q = {q:.4g}; the accountant's inputs are unchanged",
        "the headline bound is fixed in advance to the white-box per-step threat model; the white-box "
        "final-model bound (the published weights' movement from their data-independent initialisation) is "
        "beside it",
        "the Gaussian-pair figure (Agrawal et al.'s estimator, silofl.auditing.gauss) is an estimate under a "
        "Gaussian-scores assumption, not a guarantee like the SNJ bound; the paper's worked figures could "
        "not be reproduced here (its text with them was not available)",
    ]
    if nonprivate:
        notes.append("no DP (PubSub-ML*): there is no accountant ε; the bounds are computed at δ = 1e-5")
    audit_json = {
        "kind": "pubsub",
        "title": f"PubSub-ML published dp-nn on {cfg.dataset}"
        + (" (no DP)" if nonprivate else f", ε = {s.epsilon:g}")
        + ", gradient canaries",
        "research_note": s.research_note,
        "seed": s.seed,
        "method": "pubsub:dp-nn",
        "privacy_mode": "off" if nonprivate else "strict",
        "formal_guarantee": not nonprivate,
        "seeded": s.seeded,
        "split_seed": split_seed,
        "unit": "one row of the publisher's data",
        "threat_model": PER_STEP,
        "epsilon_lower_bound": head["snj"]["epsilon_lower_bound"],
        "epsilon_gauss": head["gauss"]["epsilon_estimate"],
        "epsilon_gauss_unbounded": head["gauss"]["epsilon_estimate_unbounded"],
        "confidence": s.confidence,
        "epsilon_accountant": None
        if nonprivate or not math.isfinite(model.epsilon)
        else float(model.epsilon),
        "accountant": mech.get("accountant", mech.get("name")),
        "delta": delta,
        "mechanism": mech,
        "noise_multiplier": sigma if not nonprivate else None,
        "sample_rate": q,
        "steps": T,
        "rounds": None,
        "bound": head["snj"],
        "bounds": by_threat,
        "certifiable_epsilon_max": one_run.max_auditable_eps(
            s.canaries, s.canaries, delta, 1.0 - s.confidence
        ),
        "mu_sum_statistic_expected": q * math.sqrt(T) / sigma if sigma > 0 else None,
        "canaries": {
            "m": s.canaries,
            "included": int(coins.sum()),
            "excluded": int((~coins).sum()),
            "inclusion_probability": 0.5,
            "kind": describe(s.canary_kind, canaries.d, canaries.pool[1] - canaries.pool[0]),
            "canary_kind": s.canary_kind,
            "placement": canaries.placement,
            "placement_note": placement_note(
                canaries, public, s.canary_placement, "training rows the publisher does not hold"
            ),
            "space": "gradient",
            "publisher_rows_real": n,
            "mean_times_sampled_when_included": float(canaries.sampled[coins].mean()) if coins.any() else 0.0,
            "scores": {
                "steps": "Σ_t ⟨g̃_t, u_i⟩ · q·n / C over every DP step's noisy gradient",
                "final": "−⟨θ_published − θ_init, u_i⟩ / lr",
            },
        },
        "membership_inference": {
            "note": "gradient canaries audit the mechanism; membership inference runs with "
            "input-space canaries (--canary-kind mislabelled)",
            "targets": {},
        },
        "seconds": {"publish": t},
        "notes": notes,
    }
    split = {
        "canaries": [f"gradient-canary:{i}" for i in range(s.canaries)],
        "included": coins.astype(int).tolist(),
    }
    return audit_json, split


SITE_HOOKS.register("gradient-audit", SiteHook(marker=f"{AUDIT_DIR}/spec.json", arm=SiteAudit, rejoins=False))
