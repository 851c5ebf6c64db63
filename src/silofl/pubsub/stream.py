"""Streams (PubSub-ML, Algorithm 4): a publisher's sliding ensemble of its k latest models.

Data arrives in chunks. Each chunk trains one model under the publisher's full (ε, δ); the publisher
keeps its k most recent models published and withdraws the oldest when a new one arrives. Because
every model sees a different, *disjoint* chunk, parallel composition keeps the guarantee for any
record at (ε, δ) however long the stream runs. Disjointness is enforced here: each chunk carries the
ids of its records, and a chunk that repeats an id already used is refused. Across streams, publishes and
runs, the site's ledger (``folder``, :class:`silofl.site.folder.SiteFolder`) composes what each record has
spent and refuses a chunk past the site's lifetime budget. Subscribers re-customize
whenever the models on their channels change (:meth:`StreamPublisher.add_chunk` returns what changed).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from silofl.core.errors import ConfigError
from silofl.pubsub.dp_models import Bounds, train


@dataclass
class StreamPublisher:
    """One site publishing a stream: ``k`` models live at a time, each on one disjoint chunk."""

    site: str
    features: list[str]
    task: str
    kind: str
    epsilon: float
    delta: float
    bounds: Bounds
    k: int = 1
    classes: list | None = None
    broker: object | None = None  # a Broker: publish / unpublish there; None keeps the models in memory
    seed: int | None = None  # research runs only: the guarantee then holds while the seed is secret
    train_options: dict = field(default_factory=dict)
    folder: object | None = (
        None  # a SiteFolder: every chunk is checked against its lifetime budget and recorded
    )
    send: object | None = None  # how a model's bytes are published (default: broker.publish)
    seal: object | None = None  # signs a model's bytes with the folder's release receipt (SiteFolder.release)
    live: deque = field(default_factory=deque)  # (chunk index, model id or model) of the live ensemble
    used_ids: set = field(default_factory=set)
    chunks: int = 0

    def __post_init__(self):
        if self.k < 1:
            raise ConfigError(f"ensemble size k must be ≥ 1, got {self.k}")

    def add_chunk(self, x: np.ndarray, y: np.ndarray, ids) -> dict:
        """Train on a new chunk, publish its model, withdraw the oldest beyond k. Raises ConfigError if the
        chunk repeats a record id of an earlier chunk (that would break parallel composition)."""
        ids = np.asarray(ids)
        if len(ids) != len(x) or len(set(ids.tolist())) != len(ids):
            raise ConfigError("a chunk needs one distinct record id per row")
        overlap = self.used_ids.intersection(ids.tolist())
        if overlap:
            raise ConfigError(
                f"chunk {self.chunks} repeats {len(overlap)} record(s) of earlier chunks (e.g. id "
                f"{sorted(overlap)[0]}): stream chunks must be disjoint, or the (ε, δ) guarantee "
                "would not hold by parallel composition"
            )

        def make():
            return train(
                self.kind,
                x,
                y,
                publisher=self.site,
                features=self.features,
                task=self.task,
                bounds=self.bounds,
                epsilon=self.epsilon,
                delta=self.delta,
                classes=self.classes,
                seed=None if self.seed is None else self.seed + self.chunks,
                chunk=self.chunks,
                **self.train_options,
            )

        send = self.send or (self.broker.publish if self.broker is not None else None)
        if (
            self.folder is not None
        ):  # the site's ledger: within the lifetime budget, recorded before it leaves
            if send is None:
                raise ConfigError("a stream recorded in a site's ledger needs a broker to publish to")
            model, handle = self.folder.release(
                ids.tolist(),
                self.epsilon,
                self.delta,
                make,
                send,  # type: ignore[attr-defined]
                seal=self.seal,
                what="stream-chunk",
                chunk=self.chunks,
            )
        else:
            model = make()
            handle = send(model.to_bytes()) if send is not None else model
        self.used_ids.update(ids.tolist())
        self.live.append((self.chunks, handle))
        removed = []
        while len(self.live) > self.k:
            chunk, old = self.live.popleft()
            if self.broker is not None:
                self.broker.unpublish(old)
            removed.append(chunk)
        self.chunks += 1
        return {
            "chunk": self.chunks - 1,
            "published": handle if self.broker is not None else None,
            "withdrawn_chunks": removed,
            "live_chunks": [c for c, _ in self.live],
        }

    def models(self) -> list:
        """The live ensemble (models, or their broker ids)."""
        return [h for _, h in self.live]

    def guarantee(self) -> dict:
        """What a record of this publisher's stream is protected by, however many chunks have passed."""
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "chunks": self.chunks,
            "live_models": len(self.live),
            "composition": "parallel over disjoint chunks (each record is in exactly one chunk's model)",
        }
