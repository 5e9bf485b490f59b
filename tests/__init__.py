"""The test suite (a package, so that test helpers are imported relative to it)."""
