"""``python -m bascule.cli``: the ``bascule`` command."""

import sys

from bascule.cli import main

sys.exit(main())
