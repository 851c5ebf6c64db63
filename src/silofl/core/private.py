"""Every file a site or the coordinator writes is its own: 0600 files in 0700 folders (issue 41). Un-noised
figures (a checkpoint's ``mean_grad_norm`` / ``clipped_fraction``), keys, ledgers and models live there."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077  # what a site's or coordinator's process creates: owner only
FILE_MODE, DIR_MODE = 0o600, 0o700


def private_process() -> None:
    """From now on every file and folder this process (and each process it starts) creates is its owner's
    only: the umask 077 (a site worker, a coordinator, ``deploy local``)."""
    os.umask(PRIVATE_UMASK)


def private_dir(path: Path) -> Path:
    """``path`` and every missing folder above it created 0700 (an existing one is left as it is)."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=DIR_MODE)
        os.chmod(d, DIR_MODE)  # whatever the umask
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by its owner only (created 0600, never world-readable in between; its folder
    0700 if it is created here)."""
    private_dir(Path(path).parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, FILE_MODE)  # a file that existed keeps its old mode through O_CREAT: made private too


def make_private(folder: Path) -> None:
    """Every folder under ``folder`` (itself included) 0700 and every file 0600 — what this process owns;
    links are not followed."""
    uid = os.getuid()
    for root, dirs, files in os.walk(folder):
        for name, mode in [(".", DIR_MODE)] + [(d, DIR_MODE) for d in dirs] + [(f, FILE_MODE) for f in files]:
            p = os.path.join(root, name)
            st = os.lstat(p)
            if st.st_uid == uid and (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                if stat.S_IMODE(st.st_mode) & ~mode:
                    os.chmod(p, stat.S_IMODE(st.st_mode) & mode)
