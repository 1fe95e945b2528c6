"""Package layout only (metadata lives in pyproject.toml).

The repository's top-level folders install under one import root:
``hal/`` -> ``hal``, ``backends/`` -> ``hal.backends``, ``models/`` -> ``hal.models``,
``conformance/`` -> ``hal.conformance``. Every package below them is found automatically.
"""
from setuptools import find_packages, setup

ROOTS = {"hal": "hal", "hal.backends": "backends", "hal.models": "models", "hal.conformance": "conformance"}

packages = []
for name, folder in ROOTS.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=sorted(set(packages)), package_dir=dict(ROOTS))
