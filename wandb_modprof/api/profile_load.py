"""A saved profile read back: `wandb_modprof.load(path)` gives the read-only `Profile` of a
`*.modprof.json` file that `Profile.save` wrote (any version this package reads), the file
checked at this boundary (`sinks/file/profile_file.py`: format, version, schema, sizes).
"""

from __future__ import annotations

import os

from wandb_modprof.api.profile import Profile


def load(path: str | os.PathLike[str]) -> Profile:
    """Read a profile written by `prof.save(path)`.

    The result is read-only (stats, last sample, structures, summary, `to_dict`). A file that
    is missing, not JSON, of another format or version, or does not match the schema raises
    `ModProfError` naming the file, the JSON path of the problem, what was expected and what
    was found. Loading never runs code from the file. `path` must be a regular file of at
    most `WANDB_MODPROF_MAX_FILE_MB` megabytes (default 1024): a FIFO or device is refused.

    Examples:
        >>> prof = wandb_modprof.load("run.modprof.json")         # doctest: +SKIP
        >>> print(prof.summary())                                 # doctest: +SKIP
    """
    from wandb_modprof.sinks.file.profile_file import read_profile
    from wandb_modprof.sinks.files import check_path

    return Profile.from_data(read_profile(check_path(path, "load()")))
