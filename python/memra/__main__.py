"""``python -m memra ...`` is the ``memra`` command."""

import sys

from .cli import main

sys.exit(main())
