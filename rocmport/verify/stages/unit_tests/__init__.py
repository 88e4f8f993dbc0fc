"""Stage 3, unit-tests: upstream's unit tests on the port, each failure labelled against the unported tree.
The stage is stage.py; its pieces: command, runner, baseline, labels, results, suite."""

NAME = "unit-tests"  # the stage's name (`--stages`, the report), its launches' rendezvous id
