"""A site that trains with Poisson-sampled (DP-)SGD: every example-level method's site.

It holds an optional *private* model (never leaves the site, trained without DP) and a *shared* model
trained with DP-SGD when privacy is on (Poisson batches, per-example clipping, Gaussian noise, an
accountant fed by the mechanism's own report, and a budget). With a private model a round is deep
mutual learning (ProxyFL, FML):

* private loss ``(1-α)·CE(f) + α·KL(f‖h)``, plain Adam;
* shared loss ``(1-β)·CE(h) + β·KL(h‖f)``, DP-SGD then Adam;

without one (FedAvg, AvgPush, CWT, Regular, Joint) it is DP-SGD on cross-entropy. Methods differ only
in what happens to the shared model between rounds (:mod:`silofl.fl.exchange`); the exchange
primitives — encode, read and validate, replace — are here so every method crosses the site boundary
the same way.

``shared_field`` names the shared model in metrics: ``proxy`` (ProxyFL, FML), ``global`` (FedAvg,
AvgPush, CWT, Joint) or ``private`` (Regular: the local model is the DP model).

The DP-SGD recipe (Tramèr & Boneh 2021, De et al. 2022), every part of it post-processing of the DP
gradients or a change of the mechanism the accountant is told about exactly:

* ``optimizer``: Adam (the default) or SGD with (Nesterov) momentum for the shared model;
* ``sample_rate`` q (default batch_size / n; up to 1, full batch) and ``local_steps`` DP steps per round
  (default one epoch): :func:`round_schedule`; the accountant counts the steps the mechanism ran;
* ``augmult`` K: K augmented views of every sampled image, their gradients averaged before clipping
  (:mod:`silofl.training.augment`); the sensitivity stays C;
* ``ema_decay`` d > 0: the model *evaluated and saved* is an exponential moving average of the shared
  model's round-end weights w_r (after the round's exchange): e_1 = w_1, e_r = d·e_{r−1} + (1−d)·w_r.
  Every w_r is a DP release (this site's DP iterate, or what it received, itself DP), so the EMA is
  post-processing and costs no budget. What is **exchanged** is the raw iterate, never the EMA: the
  protocol and its accounting are exactly those without EMA.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from silofl.comm.messages import Packet
from silofl.comm.wire import encode, read_model_shared
from silofl.core.errors import ConfigError, NonFiniteValue, PeerModelRejected
from silofl.core.randomness import party_seeds
from silofl.models import ModelSpec
from silofl.privacy import Accountant, Budget, DPGradient, NoiseSource, max_steps_within
from silofl.privacy.dpsgd import require_finite
from silofl.privacy.person import PersonIndex
from silofl.privacy.sampling import load_sampler_state, make_sampler, sampler_state
from silofl.site.base import DP, NONPRIVATE, PUBLIC, Site
from silofl.site.probe import probe_many
from silofl.training import Partner, dml_loss, poisson_steps
from silofl.training.augment import AugMult
from silofl.training.metrics import prefixed

log = logging.getLogger("silofl")

PROBE_EXAMPLES, PROBE_MAX_OUTPUT = 32, 1e6  # a received model must give finite logits below this on them
PROBE_REFUSED = "the model's outputs on a probe batch are not finite and bounded"


@dataclass(frozen=True)
class DPSGDSettings:
    """What a DP-SGD site needs to know to train: its own budget and mechanism, the run's seed."""

    seed: int | None  # a research run's seed; None: secret randomness (the default)
    batch_size: int
    lr: float
    weight_decay: float
    private: bool  # DP on
    noise_multiplier: float
    clip: float
    delta: float
    accountant: str
    target_epsilon: float | None
    dp_backend: str
    optimizer_state: str = "reset"
    dml_alpha: float = 0.5
    dml_beta: float = 0.0
    optimizer: str = "adam"  # the shared model's: adam | sgd
    momentum: float = 0.0
    nesterov: bool = False
    ema_decay: float = 0.0
    augmult: int = 0
    aug_pad: int = 4
    aug_flip: bool = False
    sample_rate: float | None = None
    local_steps: int | None = None
    private_lr: float | None = None  # the private model's Adam lr (None: lr)


def round_schedule(
    n: int, batch_size: int, sample_rate: float | None = None, local_steps: int | None = None
) -> tuple[float, int]:
    """(Poisson rate q, DP steps per round) of a site of ``n`` examples: q = ``sample_rate``, else
    min(1, batch_size / n); ``local_steps`` steps, else one epoch (n // batch_size, or ⌊1/q⌋ with a given
    q)."""
    if sample_rate is None:
        q, epoch = min(1.0, batch_size / n), max(1, n // batch_size)
    else:
        q, epoch = float(sample_rate), max(1, math.floor(1.0 / float(sample_rate) + 1e-9))
    return q, int(local_steps) if local_steps is not None else epoch


def shared_optimizer(params, s: DPSGDSettings) -> torch.optim.Optimizer:
    """The shared (DP) model's optimizer: Adam, or SGD with (Nesterov) momentum."""
    if s.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=s.lr, momentum=s.momentum, nesterov=s.nesterov, weight_decay=s.weight_decay
        )
    return torch.optim.Adam(params, lr=s.lr, weight_decay=s.weight_decay)


_EMA_KEYS: dict[tuple, object] = {}  # (previous EMA key, round-end token) -> key: equal histories, one key


def _ema_key(previous: object, token: object) -> object:
    if len(_EMA_KEYS) > 1_000_000:
        _EMA_KEYS.clear()
    return _EMA_KEYS.setdefault((previous, token), object())


class DPSGDSite(Site):
    """See the module doc."""

    # whether a private model trains by mutual learning on the shared model's batches (ProxyFL, FML); a method
    # whose private model trains its own way (Ditto's personal model) sets False and trains it in its own step
    mutual_learning_partner = True

    def __init__(
        self,
        cid: int,
        x: torch.Tensor,
        y: torch.Tensor,
        shared_spec: ModelSpec,
        settings: DPSGDSettings,
        private_spec: ModelSpec | None = None,
        shared_field: str = "proxy",
    ):
        super().__init__(cid)
        self.settings = s = settings
        self.x, self.y = x, y
        self.sample_rate, self.steps_per_round = round_schedule(
            self.n, s.batch_size, s.sample_rate, s.local_steps
        )
        seed_init, seed_sample, seed_noise, seed_aug = party_seeds(s.seed, cid)
        seeded = s.seed is not None
        torch.manual_seed(seed_init)
        self.private_spec, self.shared_spec, self.shared_field = private_spec, shared_spec, shared_field
        self.private = private_spec.build().to(x.device) if private_spec is not None else None
        self.shared = shared_spec.build().to(x.device)
        private_lr = s.private_lr if s.private_lr is not None else s.lr
        self.private_opt = (
            torch.optim.Adam(self.private.parameters(), lr=private_lr, weight_decay=s.weight_decay)
            if self.private is not None
            else None
        )
        self.shared_opt = shared_optimizer(self.shared.parameters(), s)
        self.augment: AugMult | None = None
        if s.augmult:
            if x.dim() != 4:
                raise ConfigError(
                    f"augmult augments images; this site's inputs have shape {tuple(x.shape[1:])}"
                )
            if s.aug_pad >= min(x.shape[2], x.shape[3]):
                raise ConfigError(
                    f"aug_pad {s.aug_pad} must be smaller than the images' sides ({x.shape[2]}×{x.shape[3]})"
                )
            self.augment = AugMult(s.augmult, s.aug_pad, s.aug_flip, seed_aug if seeded else None)
        self._ema: dict[str, torch.Tensor] | None = None  # committed EMA of round-end weights (ema_decay > 0)
        self._ema_key: object = None
        self._ema_model: torch.nn.Module | None = None
        self.sampler = make_sampler(seed_sample if seeded else None)  # Poisson sampling: secure unless seeded
        # Without a private model there is nothing to distil from: plain cross-entropy.
        self.alpha, self.beta = s.dml_alpha, (s.dml_beta if self.private is not None else 0.0)
        self.dp: DPGradient | None = None
        self.accountant: Accountant | None = None
        self.budget: Budget | None = None
        if s.private:
            self.dp = DPGradient(
                self.shared,
                clip=s.clip,
                noise_multiplier=s.noise_multiplier,
                expected_batch_size=self.sample_rate * self.n,
                noise=NoiseSource(seed_noise if seeded else None, device=x.device),
                backend=s.dp_backend,
                sample_rate=self.sample_rate,
            )
            self.accountant = Accountant(s.accountant)
            self.budget = Budget(self.accountant, s.target_epsilon, s.delta)
        self.persons: PersonIndex | None = None  # person-level DP (use_persons)
        self.privacy_unit = "row"
        self.rounds_trained = 0
        self.empty_batches = 0
        self._probe_model: torch.nn.Module | None = None
        # Identifies the shared model's current weights for evaluation caching: sites holding the
        # same broadcast (e.g. FedAvg's aggregate) are evaluated once in the simulator.
        self.shared_token: object = None

    @property
    def n(self) -> int:
        return len(self.y)

    def use_persons(self, persons: torch.Tensor, column: str) -> None:
        """Make the person the privacy unit (``--id-column``, :mod:`silofl.privacy.person`): ``persons`` gives
        each training row's person (0 … P−1). Poisson sampling is then of persons (q over the P persons, the
        batch size counting persons), each person's rows are clipped together, and the accountant is told q
        over persons. Called once, before the first round."""
        if self.rounds_trained:
            raise ConfigError("the privacy unit is set before the first round")
        if len(persons) != self.n:
            raise ConfigError(f"client {self.cid}: {len(persons)} person ids for {self.n} training rows")
        if self.augment is not None:
            raise ConfigError("--id-column (person-level DP) is for tables; augmult augments images")
        s = self.settings
        self.persons = PersonIndex(persons).to(self.x.device)
        self.sample_rate, self.steps_per_round = round_schedule(
            self.persons.count, s.batch_size, s.sample_rate, s.local_steps
        )
        self.privacy_unit = f"person (column {column})"
        if self.dp is not None:
            self.dp.person_level = True
            self.dp.sample_rate = self.sample_rate
            self.dp.expected_batch_size = self.sample_rate * self.persons.count

    # ---------------------------------------------------------------- local training
    def _shared_loss(self, logits, y, private_logp):
        return dml_loss(logits, y, private_logp, self.beta)

    def can_continue(self) -> bool:
        if self.budget is None:
            return True
        return self.budget.allows(self.settings.noise_multiplier, self.sample_rate, self.steps_per_round)

    def budget_message(self) -> str:
        if self.budget is None or self.accountant is None or self.budget.target_epsilon is None:
            return super().budget_message()
        s = self.settings
        one = self.accountant.epsilon_after(
            s.noise_multiplier, self.sample_rate, self.steps_per_round, s.delta
        )
        return (
            f"target_epsilon {self.budget.target_epsilon:g} is below the ε of a single round ({one:.3f} at "
            f"δ={s.delta:g}) for every client: no client could train; raise the budget or the noise "
            f"multiplier, "
            "or lower the batch size"
        )

    def train(self, rnd: int) -> dict:
        """One round: one epoch of Poisson batches (deep mutual learning with a private model)."""
        if self.budget is not None:
            self.budget.require(self.settings.noise_multiplier, self.sample_rate, self.steps_per_round)
        if self.settings.ema_decay and self.rounds_trained > 0:
            self._commit_ema()  # the weights the last round ended with
        partner = None
        if self.private is not None and self.private_opt is not None and self.mutual_learning_partner:
            partner = Partner(self.private, self.private_opt, self.alpha)
        try:
            stats = self._steps(partner)
        except NonFiniteValue as e:
            self._record_spend()  # the steps that ran are spent, though nothing of them is released
            raise NonFiniteValue(f"client {self.cid}, round {rnd}: {e}") from None
        self.empty_batches += stats.pop("empty_batches")
        self._record_spend()
        self.rounds_trained += 1
        self.shared_token = object()  # locally trained weights: unique to this site
        self.last_train = stats
        return stats

    def _record_spend(self) -> None:
        """The steps the mechanism ran since the last call, into the ledger (durably first: the spend
        survives a crash right after) and the accountant."""
        if self.dp is not None and self.accountant is not None:
            run = self.dp.take_run()
            if self.ledger is not None and run.steps:
                unit = {} if self.persons is None else {"unit": self.privacy_unit}
                self.ledger.record_steps(
                    self.run_label, run.noise_multiplier, run.sample_rate, run.steps, **unit
                )
            self.accountant.record(run)

    def _steps(self, partner: Partner | None) -> dict:
        """The round's Poisson steps; every parameter the site holds checked finite after them (a noised
        gradient is checked at each step by the mechanism)."""
        stats = poisson_steps(
            self.shared,
            self.shared_opt,
            self.x,
            self.y,
            sample_rate=self.sample_rate,
            steps=self.steps_per_round,
            sampler=self.sampler,
            loss_fn=self._shared_loss,
            dp=self.dp,
            partner=partner,
            augment=self.augment,
            grad_hook=self.shared_grad_hook(),
            persons=self.persons,
        )
        models = [("shared", self.shared)] + ([("private", self.private)] if self.private is not None else [])
        require_finite(
            (f"the {role} model's {n}", p.detach()) for role, m in models for n, p in m.named_parameters()
        )
        return stats

    def shared_grad_hook(self) -> Callable[[], None] | None:
        """A data-independent term added to the shared model's (DP) gradient before every optimizer step of
        this round (:func:`~silofl.training.poisson.poisson_steps`' ``grad_hook``), or None; FedProx's and
        MR-MTL's sites add their proximal pull here."""
        return None

    # ---------------------------------------------------------------- EMA of the shared model
    # (post-processing)
    def _commit_ema(self) -> None:
        d = self.settings.ema_decay
        cur = self.shared.state_dict()
        if self._ema is None:
            self._ema = {k: v.detach().clone() for k, v in cur.items() if v.is_floating_point()}
        else:
            with torch.no_grad():
                for k, e in self._ema.items():
                    e.mul_(d).add_(cur[k].detach(), alpha=1.0 - d)
        self._ema_key = _ema_key(self._ema_key, self._shared_key())

    def _shared_key(self) -> object:
        return self.shared_token if self.shared_token is not None else ("model", id(self.shared))

    def released(self) -> torch.nn.Module:
        """The shared model as evaluated and saved: the EMA of its round-end weights, the current weights
        counting as the latest (``ema_decay`` > 0), else the shared model itself."""
        if not self.settings.ema_decay:
            return self.shared
        if self._ema_model is None:
            with torch.random.fork_rng(devices=[]):  # draws nothing from the run's streams
                self._ema_model = self.shared_spec.build().to(self.x.device)
        d, cur = self.settings.ema_decay, self.shared.state_dict()
        with torch.no_grad():
            view = {
                k: (self._ema[k] * d + v.detach() * (1.0 - d))
                if self._ema is not None and k in self._ema
                else v
                for k, v in cur.items()
            }
        self._ema_model.load_state_dict(view)
        return self._ema_model

    def _released_key(self) -> object:
        return ("ema", self._ema_key, self._shared_key()) if self.settings.ema_decay else self._shared_key()

    # ---------------------------------------------------------------- exchange primitives
    def shared_state(self) -> dict[str, torch.Tensor]:
        """A detached copy of the shared model's weights."""
        return {k: v.detach().clone() for k, v in self.shared.state_dict().items()}

    def payload(self, rnd: int, extra: dict[str, torch.Tensor] | None = None, **meta) -> bytes:
        """The shared model (plus extra scalars) in wire format."""
        state = dict(self.shared.state_dict())
        state.update(extra or {})
        return encode(state, meta={"round": rnd, "src": self.cid, "model": self.shared_spec.name, **meta})

    def read(
        self,
        packet: Packet,
        extra_keys: tuple[str, ...] = (),
        rnd: int | None = None,
        probe: bool = True,
        reference: dict[str, torch.Tensor] | None = None,
    ) -> tuple[dict, dict[str, float], dict]:
        """Decode and validate a received shared model — names, shapes, dtypes, finite and bounded values, the
        round ``rnd`` and the packet's sender in its metadata, finite outputs on a probe batch of the site's
        own data — before it touches any local model: (tensors, extras, meta). Raises PeerModelRejected.
        ``probe`` False: the caller probes (:meth:`read_many`); ``reference``: the shared model's state, if at
        hand."""
        expect = {"src": packet.src} if rnd is None else {"round": rnd, "src": packet.src}
        ref = reference if reference is not None else dict(self.shared.state_dict())
        tensors, extras, meta = read_model_shared(  # decoded once per payload among this process's sites
            self.wire_cache, packet.data, ref, extra_keys, expect=expect
        )
        if probe:
            self.probe(tensors)
        return tensors, extras, meta

    def read_many(
        self, packets: list[Packet], extra_keys: tuple[str, ...] = (), rnd: int | None = None
    ) -> list[tuple[dict, dict[str, float], dict] | PeerModelRejected]:
        """:meth:`read` of each packet, in order: what it read, or why it was refused; the probes in one
        vectorised pass (:func:`silofl.site.probe.probe_many`)."""
        got: list[tuple[dict, dict[str, float], dict] | PeerModelRejected] = []
        ref = dict(self.shared.state_dict())
        for p in packets:
            try:
                got.append(self.read(p, extra_keys, rnd, probe=False, reference=ref))
            except PeerModelRejected as e:
                got.append(e)
        reads = [g for g in got if not isinstance(g, PeerModelRejected)]
        verdicts = iter(
            probe_many(self._scratch(), [t for t, _, _ in reads], self._probe_x(), PROBE_MAX_OUTPUT)
        )
        return [
            g if isinstance(g, PeerModelRejected) or next(verdicts) else PeerModelRejected(PROBE_REFUSED)
            for g in got
        ]

    def probe(self, state: dict[str, torch.Tensor]) -> None:
        """Raise PeerModelRejected unless a model with weights ``state`` gives finite, bounded outputs on the
        first examples of the site's own data (checked on a scratch model: no local model is touched)."""
        if not probe_many(self._scratch(), [state], self._probe_x(), PROBE_MAX_OUTPUT)[0]:
            raise PeerModelRejected(PROBE_REFUSED)

    def _scratch(self) -> torch.nn.Module:
        """The scratch model received weights are tried on (built once; its own weights are never used)."""
        if self._probe_model is None:
            with torch.random.fork_rng(
                devices=[]
            ):  # the scratch model's init draws nothing from the run's streams
                self._probe_model = self.shared_spec.build().to(self.x.device).eval()
        return self._probe_model

    def _probe_x(self) -> torch.Tensor:
        """The site's own examples a received model is tried on."""
        return self.x[:PROBE_EXAMPLES]

    def reject(self, rnd: int, packet: Packet, err: Exception) -> dict:
        """Log a refused packet; the record that goes into summary.json."""
        log.warning(
            "client %d rejected the model from node %d in round %d: %s", self.cid, packet.src, rnd, err
        )
        return {"round": rnd, "client": self.cid, "src": packet.src, "reason": str(err)}

    def replace_shared(self, state: dict[str, torch.Tensor], token: object = None) -> None:
        """Load received weights into the shared model; Adam's moments per ``optimizer_state``."""
        self.shared.load_state_dict(state)
        if self.settings.optimizer_state == "reset":
            self.shared_opt.state.clear()
        self.shared_token = token if token is not None else object()

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "shared": self.shared.state_dict(),
            "shared_opt": self.shared_opt.state_dict(),
            "private": self.private.state_dict() if self.private is not None else None,
            "private_opt": self.private_opt.state_dict() if self.private_opt is not None else None,
            "sampler": sampler_state(self.sampler),
            "noise": self.dp.noise.state_dict() if self.dp is not None else None,
            "accountant": self.accountant.state_dict() if self.accountant is not None else None,
            "rounds_trained": self.rounds_trained,
            "empty_batches": self.empty_batches,
            "last_train": self.last_train,
            **({"ema": self._ema} if self.settings.ema_decay else {}),
            **({"augment": self.augment.state_dict()} if self.augment is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.shared.load_state_dict(state["shared"])
        self.shared_opt.load_state_dict(state["shared_opt"])
        if self.private is not None and self.private_opt is not None:
            self.private.load_state_dict(state["private"])
            self.private_opt.load_state_dict(state["private_opt"])
        load_sampler_state(self.sampler, state["sampler"])
        if self.dp is not None:
            self.dp.noise.load_state_dict(state["noise"])
        if self.accountant is not None:
            if self.ledger is not None:
                self.restore_spend()  # what ran, from the ledger — never a number from the checkpoint
            else:
                self.accountant.load_state_dict(state["accountant"])
        self.rounds_trained, self.empty_batches = int(state["rounds_trained"]), int(state["empty_batches"])
        self.last_train = dict(state["last_train"])
        self.shared_token = object()
        if self.settings.ema_decay:
            self._ema = state.get("ema")
            self._ema_key = object() if self._ema is not None else None
        if self.augment is not None and "augment" in state:
            self.augment.load_state_dict(state["augment"])

    # ---------------------------------------------------------------- reporting
    def eval_models(self) -> list[tuple[object, torch.nn.Module]]:
        """(cache key, model) of each model :meth:`evaluate` scores, for an engine that scores many sites'
        models at once: the private model by identity, the shared one by its weights' token (sites holding one
        broadcast share it)."""
        out: list[tuple[object, torch.nn.Module]] = []
        if self.private is not None:
            out.append((("model", id(self.private)), self.private))
        out.append((self._released_key(), self.released()))
        return out

    def evaluate(self, x: torch.Tensor, y: torch.Tensor, cache: dict | None = None) -> dict[str, float]:
        """``private_acc`` and ``<shared>_acc`` with the other metrics of the same pass (``private_auroc``,
        …)."""
        out = {}
        keys = self.eval_models()  # the same keys the engine's batched scoring used
        if self.private is not None:
            out.update(
                prefixed(
                    "private_acc", self.cached_scores(keys[0][0], self.private, x, y, cache, store=False)
                )
            )
        key, model = keys[-1]
        out.update(prefixed(f"{self.shared_field}_acc", self.cached_scores(key, model, x, y, cache)))
        return out

    def own_model(self) -> torch.nn.Module | None:
        return self.private

    def epsilon(self) -> float | None:
        return None if self.accountant is None else self.accountant.epsilon(self.settings.delta)

    def metric_label(self, key: str) -> str:
        if key in (
            "examples_seen",
            "pushsum_weight",
        ):  # Poisson batch sizes depend on no record; protocol state
            return PUBLIC
        if key == f"{self.shared_field}_acc" and self.settings.private and self.beta == 0.0:
            return DP  # the DP model's accuracy on held-out data: post-processing of a DP release
        return (
            NONPRIVATE  # the private model; per-example gradient norms; a model trained without (formal) DP
        )

    def restore_spend(self) -> None:
        if self.ledger is None or self.accountant is None:
            return
        self.accountant.replay(self.ledger.history())

    def architectures(self) -> dict[str, str]:
        out = {self.shared_field: self.shared_spec.name}
        if self.private_spec is not None:
            out["private"] = self.private_spec.name
        return out

    def privacy_report(self) -> dict:
        s = self.settings
        base = {
            "client": self.cid,
            "n": self.n,
            "rounds_trained": self.rounds_trained,
            "left_at": self.left_at,
            "empty_batches": self.empty_batches,
            "clip": s.clip,
            "dp_model": self.shared_field if s.private else None,
            **(
                {"privacy_unit": self.privacy_unit, "persons": self.persons.count}
                if self.persons is not None
                else {}
            ),
        }
        if self.accountant is None or self.budget is None or self.dp is None:
            return {**base, "accountant": None, "epsilon": None, "delta": None}
        rep = self.accountant.report(s.delta)
        target = self.budget.target_epsilon
        rounds_within = None
        if target is not None:
            steps = max_steps_within(
                self.accountant.kind,
                s.noise_multiplier,
                self.sample_rate,
                s.delta,
                target,
                step_block=self.steps_per_round,
            )
            rounds_within = steps // self.steps_per_round
        if self.ledger is not None and self.persons is not None:
            base["ledger_units"] = self.ledger.units()  # every unit this site's ledger has composed
        if self.ledger is not None:  # the units this run's entries name, read back from the ledger
            base["run_units"] = sorted(
                {
                    str(e.get("unit", "row"))
                    for e in self.ledger.entries
                    if e["kind"] == "dp-sgd" and e.get("run") == self.run_label
                }
            )
        return {
            **base,
            **rep,
            "target_epsilon": target,
            "rounds_within_budget": rounds_within,
            "dp_backend": self.dp.backend_name,
        }

    def final_models(self):
        out = {self.shared_field: (self.released(), self.shared_spec)}
        if self.private is not None and self.private_spec is not None:
            out["private"] = (self.private, self.private_spec)
        return out
