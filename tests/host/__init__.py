"""Tests of retrograde.host."""
