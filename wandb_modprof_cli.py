"""The `wandb-modprof` console command's entry point, outside the package on purpose.

`import wandb_modprof` imports torch (about 3 s); a Ctrl-C in that time, before any line of the
CLI runs, used to print a long traceback. This module imports nothing heavy itself, so the
interrupt is caught here and reported as the CLI reports it later (one line, exit 130).
"""

from __future__ import annotations

import sys

_INTERRUPTED = 130  # = wandb_modprof.api.cli.EXIT_INTERRUPTED (not imported: that is the point)


def main() -> int:
    try:
        from wandb_modprof.api.cli import main as run
    except KeyboardInterrupt:
        print("wandb-modprof: error: interrupted", file=sys.stderr)
        return _INTERRUPTED
    return run()


if __name__ == "__main__":
    sys.exit(main())
