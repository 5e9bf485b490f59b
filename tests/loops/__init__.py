"""Tests of retrograde.scan / retrograde.fori_loop (the JAX loops)."""
