"""``python -m rlfleet``: the ``rlfleet`` command."""

from __future__ import annotations

import sys

from rlfleet.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
