"""`prof.save(path)` / `wandb_modprof.load(path)`: the profile as a versioned JSON file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._profile import Profile


def save_profile(prof: Profile, path: str | os.PathLike[str]) -> Path:
    raise NotImplementedError  # being written


def load(path: str | os.PathLike[str]) -> Profile:
    raise NotImplementedError  # being written
