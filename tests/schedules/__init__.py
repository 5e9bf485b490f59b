"""Tests of retrograde.schedules."""
