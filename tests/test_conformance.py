"""Runs the backend-agnostic conformance suite on every installed backend (skips unavailable ones
with their probe reason)."""
from hal.testing.conformance import *  # noqa: F401,F403
