"""The compatibility matrix: backend x reference model x mode x dtype, each cell run in its own
bounded subprocess, published as JSON, Markdown, HTML and SVG, mergeable across machines.

Schema ``hal-compat-matrix/1`` (see :mod:`hal.conformance.matrix.schema`).
"""
from hal.conformance.matrix.schema import SCHEMA, STATUSES, Cell  # noqa: F401
