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


# What must never reach a terminal from a file's content: C0 controls but newline and tab, DEL, the
# C1 controls (0x9b is a one-byte CSI on some terminals) and the bidirectional overrides and isolates
# (text that reads differently from what it is).
_UNSAFE = {*(chr(c) for c in range(0x20) if chr(c) not in "\n\t"), "\x7f", *(chr(c) for c in range(0x80, 0xA0))}
_UNSAFE |= {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
_STRIP = str.maketrans(dict.fromkeys(_UNSAFE))


def terminal_safe(text: str) -> str:
    """``text`` without what a terminal would act on instead of showing (an OSC title, a screen
    clear, a bidi override): file contents printed to a terminal go through this."""
    return text.translate(_STRIP)


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
