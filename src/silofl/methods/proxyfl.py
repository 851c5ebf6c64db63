"""ProxyFL (Kalra et al., "Decentralized federated learning through proxy model sharing"), Algorithm 1.

Per client: a private model f (any architecture, never leaves the site) and a proxy h (shared
architecture). Each round, for one epoch of Poisson-sampled batches, deep mutual learning:

* private loss ``(1-α)·CE(f) + α·KL(f‖h)``, plain Adam;
* proxy loss ``(1-β)·CE(h) + β·KL(h‖f)``, DP-SGD (clip C, noise σ) then Adam.

KL(f‖h) follows the paper's notation and the published code: the model being trained is
distilled toward the other model's (detached) output distribution, Σ p_h (log p_h − log p_f).
Then the proxy and its PushSum weight go to the round's out-neighbours; received proxies are
mixed with PushSum (self-weight 0: the received proxy replaces the local one).

Privacy modes: ``strict`` (β = 0, default) — the proxy's per-example gradient depends only on the
example and its label, so DP-SGD's guarantee holds for the proxy and everything derived from it;
``paper`` (α = β = 0.5) — the proxy also distils from the private model, which is a non-private
function of the whole local data set, so the reported ε is *not* a formal guarantee; ``off``.

Proxy optimizer state when the weights are replaced: ``reset`` (default) clears Adam's moments;
``keep`` keeps them, as the published code does. At the paper's settings ``reset`` measured higher
private and proxy accuracy on every seed (docs/proxyfl.md); the moments are post-processing of DP
gradients either way, so the choice has no privacy cost.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from silofl.config import RunConfig
from silofl.errors import PeerModelRejected
from silofl.methods.base import Client, Protocol, RoundEvents, accuracy, client_seeds
from silofl.models import ModelSpec
from silofl.privacy import Accountant, Budget, DPGradient, NoiseSource, max_steps_within, poisson_batch
from silofl.runtime.transport import Envelope, Transport
from silofl.runtime.wire import decode, encode, validate
from silofl.topology import combine, share

log = logging.getLogger("silofl")

PUSHSUM_KEY = "__pushsum_weight__"


def dml_loss(logits: torch.Tensor, y: torch.Tensor, other_logp: torch.Tensor, weight: float) -> torch.Tensor:
    """Per-example (1-w)·CE + w·KL(other ‖ model) with the other model's log-probs detached."""
    ce = F.cross_entropy(logits, y, reduction="none")
    if weight == 0.0:
        return ce
    kl = F.kl_div(F.log_softmax(logits, dim=1), other_logp, reduction="none", log_target=True).sum(1)
    return (1.0 - weight) * ce + weight * kl


class ProxyFLClient(Client):
    def __init__(
        self,
        cid: int,
        x: torch.Tensor,
        y: torch.Tensor,
        private_spec: ModelSpec,
        proxy_spec: ModelSpec,
        cfg: RunConfig,
    ):
        self.cid = cid
        self.cfg = cfg
        self.x, self.y = x, y
        self.n = len(y)
        self.sample_rate = cfg.batch_size / self.n
        self.steps_per_round = max(1, self.n // cfg.batch_size)
        seed_init, seed_sample, seed_noise, _ = client_seeds(cfg.seed, cid)
        torch.manual_seed(seed_init)
        self.private_spec, self.proxy_spec = private_spec, proxy_spec
        self.private = private_spec.build().to(x.device)
        self.proxy = proxy_spec.build().to(x.device)
        self.private_opt = torch.optim.Adam(self.private.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.proxy_opt = torch.optim.Adam(self.proxy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.sampler = torch.Generator().manual_seed(seed_sample)
        self.alpha, self.beta = cfg.dml_alpha, cfg.dml_beta
        self.dp: DPGradient | None = None
        self.accountant: Accountant | None = None
        self.budget: Budget | None = None
        if cfg.is_private:
            self.dp = DPGradient(
                self.proxy,
                clip=cfg.clip,
                noise_multiplier=cfg.noise_multiplier,
                expected_batch_size=self.sample_rate * self.n,
                noise=NoiseSource(seed_noise, secure=cfg.secure_noise, device=x.device),
                backend=cfg.dp_backend,
            )
            self.accountant = Accountant(cfg.accountant)
            self.budget = Budget(self.accountant, cfg.target_epsilon_of(cid), cfg.delta)
        self.pushsum_weight = 1.0
        self._kept_weight = 1.0
        self.rounds_trained = 0
        self.empty_batches = 0
        self.last_train: dict = {}

    # ---------------------------------------------------------------- local training
    def _proxy_loss(self, logits, y, private_logp):
        return dml_loss(logits, y, private_logp, self.beta)

    def can_continue(self) -> bool:
        if self.budget is None:
            return True
        return self.budget.allows(self.cfg.noise_multiplier, self.sample_rate, self.steps_per_round)

    def train_round(self, rnd: int) -> dict:
        if self.budget is not None:
            self.budget.require(self.cfg.noise_multiplier, self.sample_rate, self.steps_per_round)
        self.private.train()
        self.proxy.train()
        clipped, norms, seen = 0.0, 0.0, 0
        for _ in range(self.steps_per_round):
            idx = poisson_batch(self.n, self.sample_rate, self.sampler).to(self.x.device)
            xb, yb = self.x[idx], self.y[idx]
            B = len(idx)
            self.proxy_opt.zero_grad(set_to_none=True)
            if B == 0:
                self.empty_batches += 1
                if self.dp is not None:  # a noise-only step, still counted by the accountant
                    self.dp.compute(xb, self._proxy_loss, yb, torch.zeros(0, 1, device=xb.device))
                    self.proxy_opt.step()
                continue
            priv_logits = self.private(xb)
            priv_logp = F.log_softmax(priv_logits.detach(), dim=1)
            if self.dp is not None:
                proxy_logits, st = self.dp.compute(xb, self._proxy_loss, yb, priv_logp)
                clipped += st.clipped_fraction * B
                norms += st.mean_norm * B
            else:
                out = self.proxy(xb)
                self._proxy_loss(out, yb, priv_logp).mean().backward()
                proxy_logits = out.detach()
            self.proxy_opt.step()
            seen += B
            loss = dml_loss(priv_logits, yb, F.log_softmax(proxy_logits, dim=1), self.alpha).mean()
            self.private_opt.zero_grad(set_to_none=True)
            loss.backward()
            self.private_opt.step()
        if self.accountant is not None:
            self.accountant.step(self.cfg.noise_multiplier, self.sample_rate, self.steps_per_round)
        self.rounds_trained += 1
        self.last_train = {
            "examples_seen": seen,
            "clipped_fraction": clipped / seen if seen else 0.0,
            "mean_grad_norm": norms / seen if seen else 0.0,
        }
        return self.last_train

    # ---------------------------------------------------------------- exchange
    def outgoing(self, rnd: int, out_neighbors: list[int]) -> dict[int, bytes]:
        self._kept_weight, each = share(self.pushsum_weight, self.cfg.self_weight, len(out_neighbors))
        if not out_neighbors:
            return {}
        state = dict(self.proxy.state_dict())
        state[PUSHSUM_KEY] = torch.tensor(each, dtype=torch.float64)
        data = encode(state, meta={"round": rnd, "src": self.cid, "model": self.proxy_spec.name})
        return {d: data for d in out_neighbors}

    def incoming(self, rnd: int, envelopes: list[Envelope]) -> list[dict]:
        own = {k: v.detach().clone() for k, v in self.proxy.state_dict().items()}
        received, rejected = [], []
        for env in envelopes:
            try:
                tensors, _ = decode(env.data)
                w = tensors.pop(PUSHSUM_KEY, None)
                if w is None or w.numel() != 1 or not torch.isfinite(w).all() or float(w) < 0:
                    raise PeerModelRejected("missing or invalid PushSum weight")
                validate(tensors, own)
                received.append((tensors, float(w)))
            except PeerModelRejected as e:
                rec = {"round": rnd, "client": self.cid, "src": env.src, "reason": str(e)}
                log.warning("client %d rejected the proxy from client %d in round %d: %s", self.cid, env.src, rnd, e)
                rejected.append(rec)
        new_state, self.pushsum_weight = combine(own, self._kept_weight, received)
        if received:
            self.proxy.load_state_dict(new_state)
            if self.cfg.optimizer_state == "reset":
                self.proxy_opt.state.clear()
        elif self._kept_weight == 0.0:
            log.warning("client %d received no usable proxy in round %d and keeps its own", self.cid, rnd)
        return rejected

    # ---------------------------------------------------------------- reporting
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        return {"private_acc": accuracy(self.private, x, y), "proxy_acc": accuracy(self.proxy, x, y)}

    def epsilon(self) -> float | None:
        return None if self.accountant is None else self.accountant.epsilon(self.cfg.delta)

    def privacy_report(self) -> dict:
        base = {"client": self.cid, "n": self.n, "rounds_trained": self.rounds_trained, "left_at": self.left_at,
                "empty_batches": self.empty_batches, "clip": self.cfg.clip}
        if self.accountant is None:
            return {**base, "accountant": None, "epsilon": None, "delta": None}
        rep = self.accountant.report(self.cfg.delta)
        target = self.budget.target_epsilon
        rounds_within = None
        if target is not None:
            steps = max_steps_within(self.accountant.kind, self.cfg.noise_multiplier, self.sample_rate, self.cfg.delta,
                                     target, step_block=self.steps_per_round)
            rounds_within = steps // self.steps_per_round
        return {**base, **rep, "target_epsilon": target, "rounds_within_budget": rounds_within,
                "dp_backend": self.dp.backend_name}

    def final_models(self):
        return {"private": (self.private, self.private_spec), "proxy": (self.proxy, self.proxy_spec)}


class ProxyFL(Protocol):
    """One round: leave if the budget is spent, train, push proxies along the graph, mix."""

    def __init__(self, clients: list[ProxyFLClient], transport: Transport, graph):
        super().__init__(clients, transport)
        self.graph = graph

    def run_round(self, rnd: int) -> RoundEvents:
        events = RoundEvents()
        for c in self.clients:
            if c.active and not c.can_continue():
                c.leave(rnd)
                events.left.append(c.cid)
                log.info("client %d spent its budget and leaves the protocol before round %d", c.cid, rnd)
        active = [c for c in self.clients if c.active]
        for c in active:
            c.train_round(rnd)
        edges = self.graph.out_neighbors(rnd, [c.cid for c in active])
        for c in active:
            for dst, data in c.outgoing(rnd, edges[c.cid]).items():
                self.transport.send(c.cid, dst, data)
        for c in active:
            events.rejected += c.incoming(rnd, self.transport.receive(c.cid))
        return events
