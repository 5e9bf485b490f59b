"""Tests of retrograde.diffrax."""
