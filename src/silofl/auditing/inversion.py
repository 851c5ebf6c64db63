"""Gradient inversion of a hospital's update: "Inverting Gradients" (Geiping et al., NeurIPS 2020), as the
client-level DP seed's appendix attacks its clipped updates.

**The attacker is the server.** In client-level DP the noise is central: a hospital uploads its *clipped,
un-noised* update and the server adds the Gaussian noise to the sum. So the server sees each hospital's
update as it left the hospital (unless secure aggregation with distributed noise hides it: then an update
reaches the server only with noise, the "with noise" row; :data:`NOISE_BEFORE_SERVER` is the hook that
setting will flip). The attack:

1. takes the global model the server broadcast in a round and a sub-client of the audited hospital that
   holds ``images`` of its real training images (a single image or a small batch, as the seed's appendix
   does), and forms that sub-client's update exactly as the site does — ``local_epochs`` full-batch SGD
   steps at the run's local learning rate, clipped to the round's sub-client bound;
2. *with noise* adds what the server adds to the sum, N(0, (z_Δ·C)²) per coordinate at the run's update
   noise multiplier z_Δ and hospital bound C — the update as anyone past the noise sees it;
3. infers the labels from the last layer's bias (the only class whose bias moved up after one step of one
   image is its label, Zhao et al.'s iDLG; for a batch, the classes ranked by how far their bias moved up)
   when the model has a bias of one entry per class, else assumes them known — the result says which;
4. reconstructs the images by optimising dummy inputs so that the update they would produce (the same local
   steps, differentiated through) has the largest cosine similarity with the observed one, plus a
   total-variation prior; Adam on the signed gradient with step decay (the paper's recipe), inputs boxed to
   the data's value range, a few restarts from random inputs, the one with the lowest loss kept (the
   attacker never sees the truth);
5. scores the reconstructions against the true images, matched by the best assignment (Hungarian, on SSIM):
   SSIM (Wang et al. 2004: Gaussian window 11, σ 1.5, K1 0.01, K2 0.03, over the window's valid positions)
   and PSNR, both on the data's value range.

A random image's SSIM is the floor: :func:`baseline` gives it (uniform inputs in the same box, matched the
same way).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from silofl.core.errors import ConfigError

# secure aggregation with distributed noise (issue 28) would hide the un-noised update from the server: the
# client-level audit reads noise_before_server(cfg) to say which update the server sees
NOISE_BEFORE_SERVER = False


def noise_before_server(cfg) -> bool:
    """Whether the server of run ``cfg`` receives a hospital's update only with noise on it (secure
    aggregation with distributed noise): the hook that setting fills in. Today never: the noise is central."""
    return NOISE_BEFORE_SERVER


WINDOW, SIGMA, K1, K2 = 11, 1.5, 0.01, 0.03


# ---------------------------------------------------------------------------------------------- image quality
def gaussian_window(size: int = WINDOW, sigma: float = SIGMA) -> np.ndarray:
    """The normalised 2-D Gaussian window of Wang et al. (``size`` × ``size``, standard deviation
    ``sigma``)."""
    r = np.arange(size, dtype=np.float64) - (size - 1) / 2
    g = np.exp(-(r**2) / (2 * sigma**2))
    g /= g.sum()
    return np.outer(g, g)


def _filter_valid(img: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``img`` (H × W) filtered by ``w`` at every position where the window fits (no padding)."""
    k = w.shape[0]
    h, wd = img.shape
    out = np.zeros((h - k + 1, wd - k + 1))
    for i in range(k):
        for j in range(k):
            out += w[i, j] * img[i : i + h - k + 1, j : j + wd - k + 1]
    return out


def ssim(a: np.ndarray, b: np.ndarray, data_range: float) -> float:
    """Mean SSIM of two images (H × W, or C × H × W: the mean over channels), Wang et al. 2004: local means,
    variances and covariance under a Gaussian window (11, σ 1.5), C1 = (0.01·L)², C2 = (0.03·L)², L the data
    range; averaged over the positions where the window fits."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"images of different shapes {a.shape} and {b.shape}")
    if a.ndim == 2:
        a, b = a[None], b[None]
    if a.ndim != 3 or min(a.shape[1:]) < WINDOW:
        raise ConfigError(f"SSIM needs images of at least {WINDOW}×{WINDOW} pixels, got shape {a.shape}")
    if data_range <= 0:
        raise ValueError(f"data_range must be positive, got {data_range}")
    w = gaussian_window()
    c1, c2 = (K1 * data_range) ** 2, (K2 * data_range) ** 2
    out = []
    for x, y in zip(a, b, strict=True):
        mx, my = _filter_valid(x, w), _filter_valid(y, w)
        vx = _filter_valid(x * x, w) - mx * mx
        vy = _filter_valid(y * y, w) - my * my
        cxy = _filter_valid(x * y, w) - mx * my
        s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
        out.append(float(s.mean()))
    return float(np.mean(out))


def psnr(a: np.ndarray, b: np.ndarray, data_range: float) -> float:
    """Peak signal-to-noise ratio in dB: 10·log10(L² / MSE), L the data range (inf for equal images)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    mse = float(np.mean((a - b) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(data_range**2 / mse)


PSNR_CAP = 100.0  # dB: what the report shows for (numerically) identical images


def match(true: np.ndarray, rec: np.ndarray, data_range: float) -> dict:
    """Pair every true image with one reconstruction so that the summed SSIM is largest (Hungarian);
    {order: the reconstruction of each true image, ssim, psnr: per true image}."""
    from scipy.optimize import linear_sum_assignment

    n = len(true)
    s = np.array([[ssim(true[i], rec[j], data_range) for j in range(len(rec))] for i in range(n)])
    rows, cols = linear_sum_assignment(-s)
    order = cols[np.argsort(rows)]
    return {
        "order": order.tolist(),
        "ssim": [float(s[i, order[i]]) for i in range(n)],
        "psnr": [min(PSNR_CAP, psnr(true[i], rec[order[i]], data_range)) for i in range(n)],
    }


def baseline(true: np.ndarray, lo: float, hi: float, seed: int, draws: int = 8) -> dict:
    """The floor: SSIM and PSNR of uniform random images in [lo, hi] against the true ones (matched the same
    way), the mean over ``draws`` draws."""
    rng = np.random.default_rng(seed)
    s, p = [], []
    for _ in range(draws):
        r = match(true, rng.uniform(lo, hi, size=true.shape), hi - lo)
        s.append(np.mean(r["ssim"]))
        p.append(np.mean(r["psnr"]))
    return {"ssim": float(np.mean(s)), "psnr": float(np.mean(p)), "draws": draws}


# ---------------------------------------------------------------------------------------------- the update
def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's trainable parameters, detached (the point the local steps start from)."""
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def local_update(
    model: nn.Module,
    start: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    steps: int,
    create_graph: bool = False,
) -> torch.Tensor:
    """The flat update w_steps − w_0 of ``steps`` full-batch SGD steps on the mean cross-entropy of (x, y),
    from ``start`` — the site's local SGD on a sub-client of one batch (differentiable in ``x`` with
    ``create_graph``)."""
    buffers = dict(model.named_buffers())
    params = {k: v.detach().requires_grad_(True) for k, v in start.items()}
    cur = dict(params)
    for _ in range(steps):
        loss = F.cross_entropy(functional_call(model, (cur, buffers), (x,)), y)
        grads = torch.autograd.grad(loss, list(cur.values()), create_graph=create_graph)
        cur = {k: p - lr * g for (k, p), g in zip(cur.items(), grads, strict=True)}
    delta = torch.cat([(cur[k] - params[k]).reshape(-1) for k in start])
    return delta if create_graph else delta.detach()


def clip(delta: torch.Tensor, bound: float) -> torch.Tensor:
    """``delta`` scaled to norm at most ``bound`` (the site's clip)."""
    norm = float(torch.linalg.vector_norm(delta))
    return delta * min(1.0, bound / norm) if norm > 0 else delta


def label_bias(model: nn.Module, num_classes: int) -> str | None:
    """The name of the last parameter with one entry per class (the output layer's bias), or None."""
    names = [k for k, p in model.named_parameters() if p.dim() == 1 and p.numel() == num_classes]
    last = list(dict(model.named_parameters()))[-1]
    return last if names and names[-1] == last else None


def infer_labels(
    model: nn.Module, update: torch.Tensor, num_classes: int, n: int
) -> tuple[torch.Tensor | None, str]:
    """The labels of the ``n`` images behind ``update`` read from the output layer's bias, and how. After a
    descent step on cross-entropy a class's bias moves by lr·(1{y = c} − p_c) summed over the batch: up for
    the classes present, down for the others. One image: the class that moved up most (exact after one step).
    A batch: the classes ranked by how far they moved up, taken in turn. (None, why) without such a bias."""
    name = label_bias(model, num_classes)
    if name is None:
        return None, "assumed known (the model has no output bias of one entry per class)"
    offset = 0
    for k, p in model.named_parameters():
        if k == name:
            break
        offset += p.numel()
    moved = update[offset : offset + num_classes].double()
    ranked = torch.argsort(moved, descending=True)
    up = int((moved > 0).sum())
    pool = ranked[: max(1, min(up, n))]
    labels = pool[torch.arange(n) % len(pool)]
    how = (
        "inferred from the output layer's bias update (iDLG: the class whose bias moved up)"
        if n == 1
        else "inferred from the output layer's bias update (the classes whose bias moved up most, in turn)"
    )
    return labels.long(), how


# ---------------------------------------------------------------------------------------------- the attack
@dataclass
class InversionSettings:
    """The optimisation (Geiping et al.'s recipe, scaled down for a CPU)."""

    iterations: int = 1500
    restarts: int = 2
    step_size: float = 0.1  # Adam's learning rate on the signed gradient
    tv: float = 1e-4  # weight of the total-variation prior (per pixel, on the data's value range)
    seed: int = 0

    def validate(self) -> None:
        """Refuse settings below 1 (a ConfigError naming the flag)."""
        if self.iterations < 1:
            raise ConfigError(f"--inversion-iterations must be at least 1, got {self.iterations}")
        if self.restarts < 1:
            raise ConfigError(f"--inversion-restarts must be at least 1, got {self.restarts}")


@dataclass
class Inversion:
    """A reconstruction: the images, the loss of the kept restart, and every restart's final loss."""

    images: torch.Tensor
    loss: float
    losses: list[float] = field(default_factory=list)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of neighbouring pixels (anisotropic TV)."""
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., :, 1:] - x[..., :, :-1]).abs().mean()


def invert(
    model: nn.Module,
    start: dict[str, torch.Tensor],
    observed: torch.Tensor,
    shape: tuple[int, ...],
    labels: torch.Tensor,
    lr: float,
    steps: int,
    box: tuple[float, float],
    settings: InversionSettings,
) -> Inversion:
    """Reconstruct ``len(labels)`` inputs of ``shape`` whose ``steps``-step local update from ``start`` points
    along ``observed`` (1 − cosine similarity + tv·TV), Adam on the signed gradient, boxed to ``box``."""
    lo, hi = box
    gen = torch.Generator().manual_seed(settings.seed)
    target = observed.detach().float()
    tnorm = torch.linalg.vector_norm(target)
    if float(tnorm) == 0:
        raise ConfigError("the observed update is zero: there is nothing to invert")
    n = len(labels)
    tv = settings.tv * (hi - lo)
    best: Inversion | None = None
    losses = []
    for _ in range(settings.restarts):
        x = (lo + (hi - lo) * torch.rand((n, *shape), generator=gen)).requires_grad_(True)
        opt = torch.optim.Adam([x], lr=settings.step_size * (hi - lo))
        it = settings.iterations
        sched = torch.optim.lr_scheduler.MultiStepLR(
            opt, milestones=[int(it * 3 / 8), int(it * 5 / 8), int(it * 7 / 8)], gamma=0.1
        )
        loss_v = math.inf
        for _ in range(it):
            opt.zero_grad(set_to_none=True)
            d = local_update(model, start, x, labels, lr, steps, create_graph=True)
            cos = (d * target).sum() / (torch.linalg.vector_norm(d) * tnorm + 1e-12)
            loss = 1 - cos + tv * total_variation(x)
            (g,) = torch.autograd.grad(loss, [x])
            x.grad = g.sign()
            opt.step()
            sched.step()
            with torch.no_grad():
                x.clamp_(lo, hi)
            loss_v = float(loss.detach())
        d = local_update(model, start, x.detach(), labels, lr, steps)
        final = float(1 - (d * target).sum() / (torch.linalg.vector_norm(d) * tnorm + 1e-12))
        final += tv * float(total_variation(x.detach()))
        losses.append(final if math.isfinite(final) else loss_v)
        if best is None or losses[-1] < best.loss:
            best = Inversion(x.detach().clone(), losses[-1])
    assert best is not None
    best.losses = losses
    return best


def attack_update(
    model: nn.Module,
    start: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float,
    steps: int,
    subclient_clip: float | None,
    noise_std: float,
    box: tuple[float, float],
    settings: InversionSettings,
    noise_seed: int,
) -> dict:
    """The whole attack on one sub-client update (module doc): form the update of (x, y) from ``start``, clip
    it to ``subclient_clip`` (None: no clip), add N(0, ``noise_std``²) when positive, infer the labels,
    reconstruct and score. Returns the figures and the reconstruction (``images``)."""
    delta = local_update(model, start, x, y, lr, steps)
    raw_norm = float(torch.linalg.vector_norm(delta))
    if subclient_clip is not None:
        delta = clip(delta, subclient_clip)
    if noise_std > 0:
        gen = torch.Generator().manual_seed(noise_seed)
        delta = delta + noise_std * torch.randn(delta.shape, generator=gen, dtype=delta.dtype)
    out_classes = _num_classes(model, x)
    labels, how = infer_labels(model, delta, out_classes, len(y))
    known = labels is None
    if labels is None:
        labels = y
    rec = invert(model, start, delta, tuple(x.shape[1:]), labels, lr, steps, box, settings)
    lo, hi = box
    m = match(x.numpy(), rec.images.numpy(), hi - lo)
    correct = int(
        sum(min(int((labels == c).sum()), int((y == c).sum())) for c in torch.unique(torch.cat([labels, y])))
    )
    return {
        "ssim": float(np.mean(m["ssim"])),
        "psnr": float(np.mean(m["psnr"])),
        "ssim_per_image": m["ssim"],
        "psnr_per_image": m["psnr"],
        "labels": how,
        "labels_known": known,
        "labels_correct": len(y) if known else correct,
        "update_norm_before_clip": raw_norm,
        "noise_std": noise_std,
        "restart_losses": rec.losses,
        "images": rec.images[m["order"]],
    }


def _num_classes(model: nn.Module, x: torch.Tensor) -> int:
    """The number of outputs of ``model`` on inputs like ``x``."""
    with torch.no_grad():
        return int(model(x[:1]).shape[-1])


# ---------------------------------------------------------------------------------------------- in an audit
ATTACKER = (
    "the server: with central client-level DP it receives each hospital's clipped update and adds the "
    "noise itself, so it inverts the un-noised update; the with-noise row is the same update after "
    "N(0, (z_Δ·C)²) at the run's update noise multiplier — what is left to anyone who sees only the noised "
    "aggregate (or to the server under secure aggregation with distributed noise)"
)


class BroadcastRecorder:
    """At the engine seam: keeps the global model (with v and the sub-client clip) the server broadcast for
    round r."""

    def __init__(self, server: int, rnd: int):
        self.server, self.round = server, rnd
        self.state: dict[str, torch.Tensor] | None = None
        self.v, self.clip = 1, 0.0
        self.broadcasts = 0

    def before(self, step: str, requests: dict, engine) -> None:
        """Nothing to see before a call: the broadcast is read after it."""
        return None

    def after(self, step: str, requests: dict, replies: dict, engine) -> None:
        """After ``receive_global``: keep the broadcast trained from in round r (sent after round r − 1)."""
        from silofl.comm.wire import decode
        from silofl.site.subclients import CLIP, V

        if step != "receive_global" or self.state is not None:
            return
        packet = next((p for m in requests.values() for p in m.packets if p.src == self.server), None)
        if packet is None:
            return
        self.broadcasts += 1
        tensors, meta = decode(packet.data)
        if int(meta.get("round", -1)) != self.round - 1:
            return
        self.state = {k: v for k, v in tensors.items() if not (k.startswith("__") and k.endswith("__"))}
        self.v, self.clip = int(round(float(tensors[V]))), float(tensors[CLIP])


def figure(
    path, true: np.ndarray, columns: dict[str, tuple[np.ndarray, list[float]] | None], box, title: str
):
    """A PNG: one row per image; the true image, then each reconstruction with its SSIM."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [("true", (true, None)), *((k, v) for k, v in columns.items() if v is not None)]
    n = len(true)
    fig, axes = plt.subplots(n, len(cols), figsize=(2.2 * len(cols), 2.3 * n + 0.5), squeeze=False)
    lo, hi = box
    for j, (name, (imgs, scores)) in enumerate(cols):
        for i in range(n):
            ax = axes[i][j]
            img = np.clip((np.asarray(imgs[i], np.float64) - lo) / (hi - lo), 0, 1)
            if img.shape[0] == 1:
                ax.imshow(img[0], cmap="gray", vmin=0, vmax=1)
            else:
                ax.imshow(np.transpose(img[:3], (1, 2, 0)))
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(name if scores is None else f"{name}\nSSIM {scores[i]:.2f}", fontsize=8)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class InversionAttack:
    """``--attack inversion``: the server inverts a sub-client update of the audited hospital (module doc)."""

    files = ("inversion.png",)

    def __init__(self, settings):
        self.s = settings
        self.recorder: BroadcastRecorder | None = None

    @staticmethod
    def check(cfg, settings, kind: str) -> None:
        """A one-line ConfigError unless this is a client-level audit on images, for a round the run has."""
        from silofl.data.datasets import dataset_meta

        if kind != "client-level":
            what = f"a published {settings.pubsub_model}" if settings.pubsub_model else f"{cfg.method}"
            raise ConfigError(
                f"--attack inversion inverts a hospital's update in a client-level method (dp-fedavg, "
                f"dp-fedadam, dp-fednova, dp2-rmsprop); {what} is {kind}"
            )
        if not dataset_meta(cfg.dataset)["images"]:
            raise ConfigError(
                f"--attack inversion reconstructs images; dataset {cfg.dataset!r} holds table rows or bags"
            )
        if settings.inversion_round > cfg.rounds:
            raise ConfigError(
                f"--inversion-round {settings.inversion_round} is after the run's last round ({cfg.rounds})"
            )

    def observers(self, server: int) -> list:
        """The recorder of the attacked round's broadcast."""
        self.recorder = BroadcastRecorder(server, self.s.inversion_round)
        return [self.recorder]

    def run(self, ctx) -> dict:
        """The attack on the audited hospital's images; writes inversion.png; audit.json's ``inversion``."""
        import time

        from silofl.privacy.analysis import COUNT_SENSITIVITY, update_noise_multiplier

        t0 = time.perf_counter()
        s, rc, split = self.s, ctx.cfg, ctx.split
        o = rc.options
        model, x, y, idx, box = self._subject(ctx)  # a ConfigError where there is nothing to invert
        rec = self.recorder
        assert rec is not None  # checked by _subject
        steps = o.local_epochs
        if rc.is_private:
            unit_bound = rec.clip * rec.v if o.privacy_unit == "hospital" else rec.clip
            z = update_noise_multiplier(
                rc.noise_multiplier,
                o.count_noise_std(rc),
                o.norm_noise_multiplier(rc),
                COUNT_SENSITIVITY[o.privacy_unit],
            )
            sub_clip: float | None = rec.clip
        else:
            unit_bound, z, sub_clip = None, 0.0, None
        opt = InversionSettings(
            iterations=s.inversion_iterations, restarts=s.inversion_restarts, seed=s.derived(8) % 2**62
        )
        start = params_of(model)
        attack = functools.partial(
            attack_update,
            model,
            start,
            x,
            y,
            lr=o.local_lr,
            steps=steps,
            subclient_clip=sub_clip,
            box=box,
            settings=opt,
        )
        clean = attack(noise_std=0.0, noise_seed=0)
        noisy = None
        if unit_bound is not None:
            noisy = attack(noise_std=z * unit_bound, noise_seed=s.derived(9) % 2**62)
        base = baseline(x.numpy(), box[0], box[1], s.derived(10) % 2**62)
        eps = ctx.epsilon
        title = (
            f"gradient inversion by the server: hospital {ctx.site}, round {s.inversion_round}, "
            f"{len(y)} image(s); "
            + (f"σ = {rc.noise_multiplier:g}, ε = {eps:.3g} (hospital)" if eps is not None else "no DP")
        )
        figure(
            ctx.out / "inversion.png",
            x.numpy(),
            {
                "without noise": (clean["images"].numpy(), clean["ssim_per_image"]),
                "with noise": (noisy["images"].numpy(), noisy["ssim_per_image"]) if noisy else None,
            },
            box,
            title,
        )
        strip = lambda r: {k: v for k, v in r.items() if k != "images"}  # noqa: E731
        return {
            "attacker": ATTACKER,
            "server_sees": (
                "the update only after the noise (secure aggregation with distributed noise)"
                if noise_before_server(rc)
                else "each hospital's clipped, un-noised update (central DP)"
            ),
            "method": "inverting gradients (Geiping et al. 2020): cosine similarity of the updates + "
            f"total variation ({opt.tv:g}), Adam on the signed gradient, {opt.iterations} iterations, "
            f"{opt.restarts} restarts (lowest loss kept), inputs boxed to the data's value range",
            "hospital": ctx.site,
            "round": s.inversion_round,
            "images": len(y),
            "subclient": f"a sub-client of hospital {ctx.site} holding {len(y)} of its training images, "
            f"{steps} full-batch local SGD step(s) at lr {o.local_lr:g} from round {s.inversion_round}'s "
            "global model"
            + (f", clipped to the round's sub-client bound {sub_clip:.4g}" if sub_clip is not None else ""),
            "rows": [f"train:{int(i)}" for i in np.asarray(split.indices[ctx.site])[idx.numpy()]]
            if split.indices
            else [f"site{ctx.site}:{int(i)}" for i in idx],
            "value_range": list(box),
            "subclient_clip": sub_clip,
            "intermediaries_v": rec.v,
            "noise_multiplier": rc.noise_multiplier if rc.is_private else None,
            "update_noise_multiplier": z if rc.is_private else None,
            "noise_std": z * unit_bound if unit_bound is not None else None,
            "epsilon_accountant": eps,
            "delta": rc.delta if rc.is_private else None,
            "without_noise": strip(clean),
            "with_noise": strip(noisy) if noisy else None,
            "random_baseline": base,
            "figure": "inversion.png",
            "seconds": time.perf_counter() - t0,
        }

    def _subject(self, ctx):
        """The attacked round's global model and the audited hospital's images it attacks: (model, x, y, their
        indices, the data's value range); a one-line ConfigError where there is nothing to invert."""
        from silofl.models import ModelSpec

        s, split, o = self.s, ctx.split, ctx.cfg.options
        rec = self.recorder
        if rec is None or rec.state is None:
            raise ConfigError(
                f"the server broadcast no model for round {s.inversion_round}: nothing to invert"
            )
        if len(split.input_shape) != 3:
            raise ConfigError(f"--attack inversion needs image inputs (C×H×W), got shape {split.input_shape}")
        spec = ModelSpec(o.proxy_model, split.input_shape, split.num_classes)
        model = spec.build().float()
        model.load_state_dict({k: v.float() for k, v in rec.state.items()})
        x_a, y_a = split.parts[ctx.site]
        if s.inversion_images > len(y_a):
            raise ConfigError(
                f"--inversion-images {s.inversion_images}: hospital {ctx.site} holds {len(y_a)} examples"
            )
        pick = np.random.default_rng(s.derived(7)).choice(len(y_a), size=s.inversion_images, replace=False)
        idx = torch.as_tensor(np.sort(pick))
        x, y = x_a[idx].detach().cpu().float(), y_a[idx].detach().cpu().long()
        box = (
            float(min(float(p[0].min()) for p in split.parts)),
            float(max(float(p[0].max()) for p in split.parts)),
        )
        if box[1] <= box[0]:
            raise ConfigError("the inputs are constant: there is no image to reconstruct")
        return model, x, y, idx, box

    @staticmethod
    def markdown(r: dict) -> list[str]:
        """audit.md's section."""

        def row(name: str, f: dict | None) -> str:
            if f is None:
                return f"| {name} | — | — | — | no DP: no noise |"
            return (
                f"| {name} | {f['ssim']:.3f} | {f['psnr']:.1f} | {f['labels_correct']} / {r['images']} | "
                f"{f['labels']} |"
            )

        eps = "—" if r["epsilon_accountant"] is None else f"{r['epsilon_accountant']:.3f}"
        clipped = "clipped, " if r["subclient_clip"] is not None else "not clipped (no DP), "
        sigma = "—" if r["noise_multiplier"] is None else f"{r['noise_multiplier']:g}"
        return [
            f"Gradient inversion (`--attack inversion`), the attacker is {r['attacker']}. The server sees "
            f"{r['server_sees']}. Target: "
            f"{r['subclient']}. σ = {sigma}, ε (hospital) = {eps}. Reconstructions: inversion.png.",
            "",
            "| update attacked | SSIM | PSNR (dB) | labels right | labels |",
            "|---|---|---|---|---|",
            row(f"{clipped}without noise", r["without_noise"]),
            row(f"{clipped}with the server's noise", r["with_noise"]),
            f"| random images (the floor) | {r['random_baseline']['ssim']:.3f} | "
            f"{r['random_baseline']['psnr']:.1f} | — | — |",
            "",
        ]

    @staticmethod
    def summary(r: dict) -> str:
        """The CLI's line."""
        noisy = r["with_noise"]
        return (
            f"gradient inversion by the server (hospital {r['hospital']}, {r['images']} image(s), round "
            f"{r['round']}): SSIM {r['without_noise']['ssim']:.3f} without noise, "
            + (f"{noisy['ssim']:.3f} with the noise" if noisy else "no noise (no DP)")
            + f" (random images {r['random_baseline']['ssim']:.3f}) · accountant ε (hospital) "
            + ("—" if r["epsilon_accountant"] is None else f"{r['epsilon_accountant']:.3f}")
        )


def _register() -> None:
    from silofl.auditing.settings import AUDIT_ATTACKS

    AUDIT_ATTACKS.register(
        "inversion",
        InversionAttack,
        kinds=("client-level",),
        description="gradient inversion of a hospital's update by the server (client-level methods, images)",
    )


_register()
