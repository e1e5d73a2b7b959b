"""Safe file I/O for every file wandb_modprof reads or writes: the profile file, the HTML
report, pictures, traces, and the torch.profiler trace it merges. Takes a path (and the bytes);
gives the bytes read (or the path written), or a `ModProfError` saying what, where and why.

Reading refuses what is not a regular file (a FIFO with no writer would block forever,
`/dev/zero` would fill memory) and reads at most `max_file_bytes()`: `MAX_FILE_MB` megabytes
unless the environment variable `WANDB_MODPROF_MAX_FILE_MB` says otherwise. Writing is atomic:
the bytes go to a temporary file beside the target, which is renamed over it only once they are
all on disk, so a full disk (ENOSPC) or a size limit (EFBIG) leaves the old file as it was and
no temporary file. A symlink is written through (its target is replaced, the link kept); a
target that exists and is not a regular file (a device, FIFO or directory) is refused.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from wandb_modprof._errors import ModProfError

MAX_FILE_MB = 1024
"""The largest file read, in megabytes (10**6 bytes), unless `WANDB_MODPROF_MAX_FILE_MB` is set."""
MAX_FILE_MB_ENV = "WANDB_MODPROF_MAX_FILE_MB"
_CHUNK = 1 << 20


def check_path(path: Any, what: str) -> Path:
    """`path` as a `Path`, or a ModProfError (`what` is the caller, e.g. "load()")."""
    if isinstance(path, os.PathLike):
        with contextlib.suppress(TypeError):
            path = os.fspath(path)
    if not isinstance(path, str):
        shown = f"{type(path).__name__} {path!r:.60}"
        raise ModProfError(f"{what} expected a path (str or os.PathLike[str]); got {shown}")
    if "\x00" in path:
        raise ModProfError(f"{what} expected a path; got {path!r:.80}, which holds a NUL byte")
    if not path:
        raise ModProfError(f"{what} expected a path; got an empty string")
    return Path(path)


def max_file_bytes() -> int:
    """The cap on the size of a file read: `MAX_FILE_MB` MB, or `$WANDB_MODPROF_MAX_FILE_MB`."""
    text = os.environ.get(MAX_FILE_MB_ENV)
    if text is None or not text.strip():
        return MAX_FILE_MB * 10**6
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not mb > 0 or mb > 2**53 / 10**6:
        raise ModProfError(
            f"{MAX_FILE_MB_ENV} expected a positive number of megabytes; got {text!r}"
        )
    return round(mb * 10**6)


def _kind(mode: int) -> str:
    kinds = {
        stat.S_ISDIR: "a directory",
        stat.S_ISFIFO: "a FIFO (named pipe)",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")


def read_capped(path: Path, what: str) -> bytes:
    """The bytes of the regular file `path`; `what` starts the error message ("cannot load
    'x'"). Never blocks on a FIFO (opened non-blocking, then checked) and reads at most the
    cap + 1 bytes, so a file over the cap fails instead of filling memory."""
    cap = max_file_bytes()
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise ModProfError(f"{what}: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as e:
        os.close(fd)
        raise ModProfError(f"{what}: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):  # the message the OS gives for reading one
            raise ModProfError(f"{what}: Is a directory")
        raise ModProfError(f"{what}: it is {_kind(mode)}; expected a regular file")
    with os.fdopen(fd, "rb", buffering=0) as f:
        return _read_at_most(f, cap, what)


def _read_at_most(f: Any, cap: int, what: str) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= cap:
            chunk = f.read(min(_CHUNK, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise ModProfError(f"{what}: {e.strerror or e}") from None
    if size > cap:
        raise ModProfError(too_large(what, cap))
    return b"".join(chunks)


def too_large(what: str, cap: int) -> str:
    """The error for a file (or its decompressed content) over `cap` bytes."""
    return (
        f"{what}: larger than the {cap / 10**6:g} MB limit on files read; set "
        f"{MAX_FILE_MB_ENV} to a larger number of megabytes to read it"
    )


def write_atomic(path: Path, data: bytes, what: str) -> Path:
    """Write `data` to `path` through a temporary file renamed over it; returns `path`.

    A target that is not a regular file raises a ModProfError starting with `what` ("cannot
    save profile to 'x'"); an OSError (no such directory, permission, a full disk) propagates
    for the caller to word, after the temporary file is removed.
    """
    # realpath: through a symlink (any chain of them) to the file it names, so the link stays.
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        old: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        old = None
    if old is not None and not stat.S_ISREG(old.st_mode):
        if stat.S_ISDIR(old.st_mode):
            raise ModProfError(f"{what}: it is a directory (expected a file name)")
        raise ModProfError(f"{what}: it is {_kind(old.st_mode)}; expected a regular file")
    # A short name of its own: the target's name plus a suffix could pass the 255-byte limit
    # on a name that the file system accepts.
    tmp = target.with_name(f".modprof-{secrets.token_hex(8)}.tmp")
    # os.open with 0o666 (not mkstemp's 0o600): a new file gets the usual umask permissions.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            if old is not None:  # a replaced file keeps its permissions
                os.chmod(tmp, stat.S_IMODE(old.st_mode))
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def missing_directory(error: OSError, target: Path) -> str | None:
    """ "directory 'x' does not exist" where that is why `error` happened writing `target`
    (not merely ENOENT: /proc exists and refuses new files with ENOENT too)."""
    if not isinstance(error, FileNotFoundError):
        return None
    try:
        parent = Path(os.path.realpath(target)).parent if target.is_symlink() else target.parent
        exists = parent.is_dir()
    except OSError:  # the path itself is unusable (longer than the system allows)
        return None
    return None if exists else f"directory {str(parent)!r} does not exist"
