"""Exceptions that carry the exit code a CI script can rely on.

0 ok, 1 the operation found a problem (conflicts, failed verification, drift),
2 usage / bad input (unknown ref, malformed lock, dangerous URL ...).
"""

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2


class RocmportError(Exception):
    """A failure with a one-line message for the user and an exit code."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class BadInput(RocmportError):
    """Bad user input: a file, ref, URL or option that cannot be used (exit 2)."""

    exit_code = EXIT_USAGE


class ProblemFound(RocmportError):
    """The operation ran and found a problem (exit 1): a conflict, drift, a failed stage."""

    exit_code = EXIT_PROBLEM
