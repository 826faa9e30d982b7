"""``python -m iris_fw …`` is the ``iris-fw`` command."""

import sys

from .cli import main

sys.exit(main())
