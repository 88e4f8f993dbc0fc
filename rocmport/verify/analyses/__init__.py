"""What verify reads off the port besides running it: which rewritten call sites ran (port_sites) and
which unit tests an upstream change reaches (impact)."""
