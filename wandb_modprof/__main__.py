import sys

from wandb_modprof.api.cli import main

sys.exit(main())
