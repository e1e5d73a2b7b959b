"""Safe file I/O (`sinks/files.py`) through the public calls: `load`, `save`, `to_html`,
`to_svg`, `export_chrome_trace`: no blocking or unbounded reads, bad paths as ModProfError,
atomic writes through symlinks that never replace a device, FIFO or directory."""

from __future__ import annotations

import contextlib
import errno
import functools
import gzip
import io
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import wandb_modprof
from wandb_modprof import ModProfError, Profile

ENV = "WANDB_MODPROF_MAX_FILE_MB"


@pytest.fixture(scope="module")
def prof() -> Profile:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with wandb_modprof.profile(model) as p:
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
    return p


def _fails_fast(call: Callable[[], Any], fifo: Path) -> BaseException | None:
    """What `call()` raised, run in a thread; fails if it is still blocked on the FIFO after
    20 s (and then opens the FIFO's other end, so that the blocked thread can end)."""
    raised: list[BaseException | None] = [None]

    def run() -> None:
        try:
            call()
        except BaseException as e:  # handed to the test thread
            raised[0] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():
        with contextlib.suppress(OSError):  # a blocked reader: give it a writer, then EOF
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a blocked writer: EPIPE
        thread.join(1)
        os.close(reader)
        pytest.fail(f"{call} blocked on the FIFO {fifo}")
    return raised[0]


# ---- reading -----------------------------------------------------------------------------------
def test_load_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "p.modprof.json"
    os.mkfifo(fifo)
    error = _fails_fast(lambda: wandb_modprof.load(fifo), fifo)
    assert isinstance(error, ModProfError), error
    assert str(error) == (
        f"cannot load {str(fifo)!r}: it is a FIFO (named pipe); expected a regular file"
    )


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_load_refuses_a_device() -> None:
    with pytest.raises(ModProfError, match=r"'/dev/zero': it is a character device; expected a"):
        wandb_modprof.load("/dev/zero")


def test_load_caps_the_size_read(
    prof: Profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = prof.save(tmp_path / "p.modprof.json")
    size = path.stat().st_size
    monkeypatch.setenv(ENV, f"{(size - 1) / 10**6}")
    with pytest.raises(ModProfError) as info:
        wandb_modprof.load(path)
    assert str(info.value) == (
        f"cannot load {str(path)!r}: larger than the {(size - 1) / 10**6:g} MB limit on files "
        f"read; set {ENV} to a larger number of megabytes to read it"
    )
    monkeypatch.setenv(ENV, f"{size / 10**6}")  # exactly the cap is still read
    assert wandb_modprof.load(path).num_samples == prof.num_samples
    for bad in ("ten", "0", "-1", "nan", "inf"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ModProfError, match=rf"{ENV} expected a positive number .*{bad!r}"):
            wandb_modprof.load(path)


def test_profiler_trace_reads_are_safe(
    prof: Profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    out = tmp_path / "out.json"
    error = _fails_fast(lambda: prof.export_chrome_trace(out, torch_profiler=fifo), fifo)
    assert isinstance(error, ModProfError) and "it is a FIFO" in str(error), error
    bomb = tmp_path / "bomb.json.gz"  # 2 MB of zeros in a few kB: the cap holds decompressed
    bomb.write_bytes(gzip.compress(b"0" * 2 * 10**6))
    monkeypatch.setenv(ENV, "1")
    with pytest.raises(ModProfError, match=rf"bomb\.json\.gz': larger than the 1 MB .*{ENV}"):
        prof.export_chrome_trace(out, torch_profiler=bomb)
    with pytest.raises(ModProfError, match=r"torch_profiler expected a path; .*NUL byte"):
        prof.export_chrome_trace(out, torch_profiler="a\x00b")
    assert not out.exists()


@pytest.mark.parametrize("path", [None, 123, b"p.modprof.json", "a\x00b", ""])
def test_bad_paths_are_mod_prof_errors(prof: Profile, path: Any) -> None:
    with pytest.raises(ModProfError, match=r"^load\(\) expected a path"):
        wandb_modprof.load(path)
    with pytest.raises(ModProfError, match=r"^save\(\) expected a path"):
        prof.save(path)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc")
def test_save_where_the_directory_refuses_files_does_not_say_it_is_missing(
    prof: Profile,
) -> None:
    with pytest.raises(ModProfError) as info:
        prof.save("/proc/x.modprof.json")
    assert "does not exist" not in str(info.value), info.value
    assert str(info.value).startswith("cannot save profile to '/proc/x.modprof.json': ")


# ---- writing -----------------------------------------------------------------------------------
_WRITERS: dict[str, Callable[[Profile, Path], object]] = {
    "save": lambda p, path: p.save(path),
    "to_html": lambda p, path: p.to_html(path),
    "to_svg": lambda p, path: p.to_svg(path),
    "trace": lambda p, path: p.export_chrome_trace(path),
}


@pytest.mark.parametrize("writer", list(_WRITERS))
def test_a_long_name_the_file_system_accepts_is_written(
    prof: Profile, tmp_path: Path, writer: str
) -> None:
    """A 245-byte file name (the limit is 255): the temporary file written first must not add
    bytes past the limit."""
    path = tmp_path / ("n" * 240 + ".json")
    _WRITERS[writer](prof, path)
    assert path.stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("writer", list(_WRITERS))
def test_a_path_longer_than_the_system_allows_is_a_mod_prof_error(
    prof: Profile, tmp_path: Path, writer: str
) -> None:
    deep = tmp_path.joinpath(*["d" * 200] * 25, "p.json")  # > PATH_MAX (4096 bytes)
    with pytest.raises(ModProfError, match=r"cannot .*: File name too long"):
        _WRITERS[writer](prof, deep)


@pytest.mark.parametrize("writer", list(_WRITERS))
def test_writes_go_through_links_and_never_replace_other_files(
    prof: Profile, tmp_path: Path, writer: str
) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "out"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link"
    link.symlink_to(target)
    _WRITERS[writer](prof, link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() != b"old" and len(target.read_bytes()) > 100
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # a replaced file keeps its mode
    assert sorted(os.listdir(tmp_path / "real")) == ["out"]  # no temporary file left

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link.unlink()
    link.symlink_to(fifo)
    for path in (fifo, link):
        error = _fails_fast(functools.partial(_WRITERS[writer], prof, path), fifo)
        assert isinstance(error, ModProfError), error
        assert str(error).endswith("it is a FIFO (named pipe); expected a regular file")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink()
    with pytest.raises(ModProfError, match=r"it is a directory \(expected a file name\)$"):
        _WRITERS[writer](prof, tmp_path / "real")
    assert sorted(os.listdir(tmp_path)) == ["fifo", "link", "real"]


@pytest.fixture
def fill_disk(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[int]]:
    """Once called, every file opened for writing takes half of what it is given, then fails
    with ENOSPC (EFBIG every other time): a full disk or a size limit reached partway. Gives
    the count of failed writes."""
    real_open = io.open
    calls = [0]

    class Filling:
        def __init__(self, f: Any) -> None:
            self._f = f

        def write(self, data: bytes | str) -> int:
            self._f.write(data[: len(data) // 2])
            self._f.flush()
            calls[0] += 1
            code = errno.ENOSPC if calls[0] % 2 else errno.EFBIG
            raise OSError(code, os.strerror(code))

        def __getattr__(self, name: str) -> Any:
            return getattr(self._f, name)

        def __enter__(self) -> Filling:
            return self

        def __exit__(self, *exc: object) -> None:
            self._f.close()

    def filling_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(file, mode, *args, **kwargs)
        return Filling(f) if any(c in mode for c in "wax+") else f

    def start() -> list[int]:
        monkeypatch.setattr(io, "open", filling_open)
        return calls

    return start


@pytest.mark.parametrize("writer", list(_WRITERS))
def test_a_failed_write_keeps_the_old_file(
    prof: Profile, tmp_path: Path, writer: str, fill_disk: Callable[[], list[int]]
) -> None:
    target = tmp_path / "out"
    target.write_bytes(b"the old file")
    failed = fill_disk()
    for _ in range(2):  # ENOSPC, then EFBIG
        with pytest.raises(ModProfError, match=r"(No space left on device|File too large)$"):
            _WRITERS[writer](prof, target)
    assert failed[0] == 2
    assert target.read_bytes() == b"the old file"
    assert os.listdir(tmp_path) == ["out"]  # no temporary file left
