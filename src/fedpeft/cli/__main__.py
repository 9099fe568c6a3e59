"""``python -m fedpeft.cli``."""

import sys

from fedpeft.cli import main

sys.exit(main())
