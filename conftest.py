"""Test configuration for the tests and for the ``>>>`` examples in ``src/``: float64 everywhere,
and 8 host devices for the sharding tests. At the repository root so that it is loaded before
JAX is imported whichever files are collected (``pytest tests/...`` or ``pytest src/...``)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_ENABLE_X64", "1")
