"""Shared test helpers: real git repositories, a real package index on loopback, patch series and
ported projects to run the CLI against (no mocks of git or the index)."""
