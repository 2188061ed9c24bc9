"""``python -m runner.cli``: the same as the ``kl`` script."""

import sys

from runner.cli import main

sys.exit(main())
