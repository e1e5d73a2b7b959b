"""Command line: `wandb-modprof COMMAND ...` or `python -m wandb_modprof COMMAND ...`.

Both run `wandb_modprof_cli.main`, named here for `python -m wandb_modprof` and for callers
inside the package. `wandb_modprof_cli` (outside the package, importing no torch, so every
`--help` answers at once) holds the command table, the parser, the exit statuses and the
usage-error format; what each command does is `wandb_modprof.api.cli_commands`. The imports go
one way: this module -> `wandb_modprof_cli` -> `cli_commands`, which imports neither.
"""

from __future__ import annotations

import sys

from wandb_modprof_cli import (
    EXIT_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REGRESSED,
    build_parser,
    main,
)

__all__ = [
    "EXIT_INPUT",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_REGRESSED",
    "build_parser",
    "main",
]

if __name__ == "__main__":
    sys.exit(main())
