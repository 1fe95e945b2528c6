"""``hal-audit``: placeholder until the audit CLI lands (issue 4)."""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    sys.stderr.write("hal-audit: error: not implemented yet\n")
    return 2
