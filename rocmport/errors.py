"""Exceptions that carry the exit code a CI script can rely on (docs/exit-codes.md).

0 ok, 1 the operation found a problem (conflicts, failed verification, drift, a git or file-system
failure), 2 usage / bad input (unknown ref, malformed lock, dangerous URL ...), 3 another run holds
a lock that is never waited for (the bot's), 70 an internal error: a bug in rocmport (the cli
writes its traceback to a log file and prints where).
"""

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_BUSY = 3
EXIT_INTERNAL = 70  # EX_SOFTWARE (sysexits.h)


class RocmportError(Exception):
    """A failure with a one-line message for the user and an exit code."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


def is_control(c: str) -> bool:
    """A control character (newline, tab, NUL, DEL ...): no place in a name, a ref or a one-line message."""
    return ord(c) < 0x20 or ord(c) == 0x7F


def one_line(text: str) -> str:
    """``text`` with its control characters escaped (a newline as \\n): a message quoting a hostile key
    or value stays one line."""
    return "".join(repr(c)[1:-1] if is_control(c) else c for c in text)


class BadInput(RocmportError):
    """Bad user input: a file, ref, URL or option that cannot be used (exit 2). Always one line:
    whatever part of the input the message quotes, its control characters are escaped."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(one_line(message), exit_code)


class ProblemFound(RocmportError):
    """The operation ran and found a problem (exit 1): a conflict, drift, a failed stage."""

    exit_code = EXIT_PROBLEM


class Busy(RocmportError):
    """Another run holds a lock this one does not wait for (exit 3)."""

    exit_code = EXIT_BUSY
