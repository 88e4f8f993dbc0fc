"""Stage 3, unit-tests: upstream's unit tests on the port, each failure labelled against the unported
tree (runner: the command, the run and its labels; suite: the default files and known failures)."""
