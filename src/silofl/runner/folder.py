"""The run folder contract (shared/CONVENTIONS.md): config.yaml (what the user asked, resolved), plan.json
(what the run derived from it and the data: :mod:`silofl.runner.plan`), metrics.jsonl (+ .csv), summary.json,
PNG plots and models/*.safetensors with a JSON spec each. :func:`read_run_config` reads a finished run's
config as it ran (config.yaml with plan.json's values; a folder written before plans were has them in its
config.yaml)."""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
from pathlib import Path

from silofl.core.errors import ConfigError

RUN_FILES = ("config.yaml", "plan.json", "metrics.jsonl", "metrics.csv", "summary.json")
RUN_DIRS = ("models", "checkpoint", "sites")


def check_out_path(out: str | Path, flag: str = "--out") -> Path:
    """``out`` as a folder path that can be made: refuse an empty path (it would mean the current folder), a
    path that is a file or lies under a file, and one whose nearest existing folder cannot be written — before
    anything is written (one-line ConfigErrors)."""
    if not str(out).strip():
        raise ConfigError(f"{flag} is empty: name the folder to write")
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {p} is a file, not a folder")
    parent = p
    while not parent.exists():
        if parent.is_symlink():
            raise ConfigError(f"{flag} {p}: {parent} is a broken link")
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {p} lies under {parent}, which is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {p}: {parent} is not writable")
    return p


def check_out(out: str | Path, resume: bool = False, overwrite: bool = False) -> None:
    """Refuse an output path that is a file, or that holds another run (unless resuming it or asked to
    overwrite it) — before anything is written."""
    p = check_out_path(out)
    if resume:
        return
    if p.is_dir() and any((p / f).exists() for f in (*RUN_FILES, *RUN_DIRS)) and not overwrite:
        raise ConfigError(
            f"{p} already holds a run; choose another --out, continue it with --resume, or replace it "
            "with --overwrite"
        )


class Stash:
    """A previous run's files moved aside (for --overwrite) until the new run has started: :meth:`drop`
    deletes them, :meth:`restore` puts them back (the new run failed before writing anything of its own)."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.path = self.out / ".previous-run"
        self.moved: list[str] = []
        if not self.out.is_dir():
            return
        names = [*RUN_FILES, *RUN_DIRS, *(f.name for f in self.out.glob("*.png"))]
        for name in names:
            if (self.out / name).exists():
                self.path.mkdir(exist_ok=True)
                (self.out / name).rename(self.path / name)
                self.moved.append(name)

    def drop(self) -> None:
        """Delete the previous run's files."""
        import shutil

        shutil.rmtree(self.path, ignore_errors=True)
        self.moved = []

    def restore(self) -> None:
        """Put the previous run's files back."""
        import shutil

        for name in self.moved:
            target = self.out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            (self.path / name).rename(target)
        shutil.rmtree(self.path, ignore_errors=True)
        self.moved = []


def clean_json(v):
    """``v`` with every non-finite float replaced by None (JSON has no inf/nan)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: clean_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean_json(x) for x in v]
    return v


def mean_std(values) -> dict:
    """{"mean", "std"} (population std) of the values that are not None; both None if there are none."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "std": None}
    return {"mean": statistics.fmean(vals), "std": statistics.pstdev(vals) if len(vals) > 1 else 0.0}


class RunFolder:
    """The run folder being written (see the module doc)."""

    def __init__(self, out: str | Path, keep_until: int | None = None):
        """A fresh run folder; with ``keep_until`` (resuming) the metrics of rounds ≤ it are kept."""
        self.path = Path(out)
        self.path.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.path / "metrics.jsonl"
        self.records: list[dict] = []
        if keep_until is not None and self.metrics_path.is_file():
            self.records = [r for r in read_metrics(self.path) if r["round"] <= keep_until]
        self.metrics_path.write_text("".join(json.dumps(clean_json(r)) + "\n" for r in self.records))

    def write_config(self, cfg, plan=None) -> None:
        """Write the resolved config as asked (``cfg.to_yaml()``) and, when given, the run's plan
        (plan.json)."""
        (self.path / "config.yaml").write_text(cfg.to_yaml())
        if plan is not None:
            from silofl.runner.plan import write_plan

            write_plan(plan, self.path)

    def add_metrics(self, records: list[dict]) -> None:
        """Append evaluation records to metrics.jsonl."""
        with self.metrics_path.open("a") as f:
            for r in records:
                f.write(json.dumps(clean_json(r)) + "\n")
        self.records += records

    def write_metrics_csv(self) -> None:
        """metrics.csv: the same records as metrics.jsonl, one column per key."""
        if not self.records:
            return
        keys: list[str] = []
        for r in self.records:
            keys += [k for k in r if k not in keys]
        with (self.path / "metrics.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for r in self.records:
                w.writerow(clean_json(r))

    def write_summary(self, summary: dict) -> None:
        """Write summary.json."""
        (self.path / "summary.json").write_text(json.dumps(clean_json(summary), indent=2) + "\n")


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of a run folder's metrics.jsonl."""
    p = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def values_by_round(run_dir: str | Path, key: str) -> dict[int, list[float]]:
    """Every client's value of ``key`` per evaluated round of one run."""
    out: dict[int, list[float]] = {}
    for rec in read_metrics(run_dir):
        if rec.get(key) is not None:
            out.setdefault(rec["round"], []).append(rec[key])
    return out


def read_config(run_dir: str | Path) -> dict:
    """A run folder's settings as it ran, as one flat mapping (common settings and the method's options),
    whether its config.yaml nests the method's section or is flat (:func:`read_run_config`)."""
    return read_run_config(run_dir).to_flat()


def read_run_config(run_dir: str | Path):
    """A finished run's config as it ran: config.yaml (what was asked) with the derived values of plan.json
    (split seed, examples per client, batch size, σ) filled in; a folder written before plans has them in
    config.yaml."""
    from silofl.runner.config import RunConfig, load_yaml_mapping
    from silofl.runner.plan import as_run, read_plan

    return RunConfig.from_dict(
        as_run(load_yaml_mapping(Path(run_dir) / "config.yaml"), read_plan(run_dir)), strict=False
    )


LOCK_FILE = ".lock"


class OutLock:
    """An exclusive OS-level lock on a run folder (``OUT/.lock``, ``fcntl.flock``) held for the life of the
    run that writes it: a second run into the same ``--out`` is refused at once with a one-line ConfigError,
    whatever state the folder is in. The kernel releases the lock when the process ends, crashed or killed, so
    a stale lock file never blocks a later run. Leaving the block removes the lock file, and the folders it
    made when the run left nothing else in them (bad input writes nothing)."""

    def __init__(self, out: str | Path, flag: str = "--out"):
        self.out = check_out_path(out, flag)
        self.flag = flag
        self.fd: int | None = None
        self.made: list[Path] = []

    def __enter__(self) -> OutLock:
        import fcntl

        missing = []
        p = self.out
        while not p.exists():
            missing.append(p)
            p = p.parent
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot make {self.flag} {self.out}: {e.strerror}") from None
        self.made = missing  # deepest first
        lock = self.out / LOCK_FILE
        while True:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as e:
                self._cleanup()
                raise ConfigError(f"cannot write {self.flag} {self.out}: {e.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise ConfigError(
                    f"{self.flag} {self.out} is being written by another run (process {holder}); "
                    "wait for it to finish or choose another folder"
                ) from None
            # the file we locked must still be the one at the path (a finishing run removes its lock file)
            try:
                same = os.fstat(fd).st_ino == os.stat(lock).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            (self.out / LOCK_FILE).unlink(missing_ok=True)  # while still holding it (see __enter__)
            os.close(self.fd)
            self.fd = None
        self._cleanup()

    def _cleanup(self) -> None:
        for d in self.made:  # the folders this lock made, deepest first, if the run left them empty
            try:
                d.rmdir()
            except OSError:
                break
        self.made = []
