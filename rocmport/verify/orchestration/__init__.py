"""The parent side of verify: the run and its options, the stage contract and list, the launchers,
the firewall, the processes' environment, TE's Python layer, and the report and summary."""
