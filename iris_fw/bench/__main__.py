"""``python -m iris_fw.bench …`` is ``iris-fw bench …``."""

import sys

from .harness import main

sys.exit(main())
