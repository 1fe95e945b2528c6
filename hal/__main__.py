"""``python -m hal``: the ``hal`` command (``python -m hal audit ...`` is ``hal-audit ...``)."""
import sys

from hal.cli.main import main

sys.exit(main())
