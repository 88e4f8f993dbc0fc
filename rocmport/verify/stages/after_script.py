"""Upstream's own criterion for a functional case: the ``AFTER_SCRIPT`` of its model_config.yaml.

Upstream's launcher (tests/functional_tests/shell_test_utils/_run_training.sh) runs the training under
torchrun with ``--log-dir $LOG_DIR --redirects 3`` (every rank's stdout and stderr in a file under
``$LOG_DIR = $OUTPUT_PATH/logs/$REPEAT``), keeps its exit status in ``EXIT_CODE``, then ``eval``s the
case's AFTER_SCRIPT and ends with ``exit ${EXIT_CODE:-0}``. The cases that carry one (the reruns cases)
use a few idioms only: they define ``check_log`` / ``check_log_not``, which ``grep -r $1 "$2" $LOG_DIR``
and ``exit 1`` when the text is missing (check_log) or present (check_log_not), call them with ``-F
TEXT`` (a fixed string) or ``-E REGEX`` (an extended regular expression), and set ``EXIT_CODE=0``: the
training's own exit status no longer decides, the checks do (persistent_1 exits 16 on purpose).

:func:`parse` reads exactly those idioms, from the YAML (never a hand-kept copy); any other statement is
refused, named, and the case is unsupported-in-proxy. :func:`evaluate` decides the checks over a run's
log with grep's semantics (line by line; -F a substring, -E a POSIX ERE translated by
:func:`ere_to_python`, which refuses what it cannot translate exactly). :func:`proxy_cause` tells a check
the CPU proxy itself fails (a line it prints differently from a GPU) from one the code fails."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The two functions as upstream writes them (every line that has AFTER_SCRIPT, v0.15 to main), each
# with what it does with a match: check_log passes when grep finds the text, check_log_not when it does not.
FUNCTIONS: dict[str, tuple[str, bool]] = {
    "check_log": ('check_log() { if [[ -z $(grep -r $1 "$2" $LOG_DIR) ]]; then exit 1; else echo OK; fi }', True),
    "check_log_not": (
        'check_log_not() { if [[ -z $(grep -r $1 "$2" $LOG_DIR) ]]; then echo OK; else exit 1; fi }',
        False,
    ),
}
# grep's pattern options the checks use: -F a fixed string, -E an extended regular expression.
GREP_MODES = ("-F", "-E")
EXIT_ZERO = "EXIT_CODE=0"


class NotTranslated(ValueError):
    """A statement or pattern verify does not read exactly (its message names it)."""


@dataclass(frozen=True)
class LogCheck:
    """One call of check_log (``wanted``: the text must be in the log) or check_log_not (must not),
    with grep's mode (-F, -E) and the pattern as bash hands it to grep."""

    function: str
    mode: str
    pattern: str

    @property
    def wanted(self) -> bool:
        return FUNCTIONS[self.function][1]

    def describe(self) -> str:
        return f"{self.function} {self.mode} {self.pattern!r}"

    def matcher(self) -> re.Pattern[str] | None:
        """The compiled Python pattern of an -E check (None for -F)."""
        return re.compile(ere_to_python(self.pattern)) if self.mode == "-E" else None

    def found(self, lines: list[str]) -> bool:
        """Whether grep would print a line of ``lines`` for this pattern."""
        rx = self.matcher()
        if rx is None:
            return any(self.pattern in line for line in lines)
        return any(rx.search(line) for line in lines)


@dataclass(frozen=True)
class AfterScript:
    """A case's AFTER_SCRIPT as verify runs it: its checks in order, and whether it sets EXIT_CODE=0
    (then the training's exit status does not decide the case: the checks do)."""

    checks: tuple[LogCheck, ...]
    exit_zero: bool

    def describe(self) -> str:
        n = len(self.checks)
        head = f"decided by upstream's AFTER_SCRIPT checks ({n} check{'s' if n != 1 else ''} of the run's log"
        return head + (", EXIT_CODE=0: the training's exit status does not decide)" if self.exit_zero else ")")


def parse(text: str) -> AfterScript:
    """The AFTER_SCRIPT ``text`` as checks, or NotTranslated naming the first statement verify does not read."""
    defined: set[str] = set()
    checks: list[LogCheck] = []
    exit_zero = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        function = next((f for f, (body, _) in FUNCTIONS.items() if line == body), None)
        if function is not None:
            defined.add(function)
            continue
        if re.match(r"\w+\s*\(\)", line):
            raise NotTranslated(f"{line!r} defines a function otherwise than upstream's check_log / check_log_not")
        if line == EXIT_ZERO:
            exit_zero = True
            continue
        words = shell_words(line)
        if words[0] in FUNCTIONS:
            if words[0] not in defined:
                raise NotTranslated(f"{line!r} calls {words[0]} before the script defines it")
            if len(words) != 3 or words[1] not in GREP_MODES:
                raise NotTranslated(f"{line!r}: verify reads {words[0]} with -F TEXT or -E REGEX only")
            if not words[2] or "\n" in words[2]:
                raise NotTranslated(f"{line!r}: an empty or multi-line pattern")
            check = LogCheck(words[0], words[1], words[2])
            if check.mode == "-E":
                try:  # refused here, at plan time, when it does not translate
                    ere_to_python(check.pattern)
                except NotTranslated as e:
                    raise NotTranslated(f"{line!r}: {e}") from None
            checks.append(check)
            continue
        raise NotTranslated(f"{line!r} is not one of upstream's check idioms (check_log, check_log_not, EXIT_CODE=0)")
    return AfterScript(tuple(checks), exit_zero)


# --- bash words -----------------------------------------------------------------------------------

# Characters bash gives a meaning to outside quotes (operators, expansions, globs, comments).
_UNQUOTED_SPECIAL = set("|&;<>()$`\\\"' \t*?[]{}~#=!")
# Inside double quotes, a backslash escapes only these (bash's manual, "Double Quotes").
_DQ_ESCAPABLE = set('$`"\\\n')


def shell_words(line: str) -> list[str]:
    """``line``'s words as bash splits and unquotes them, for a line of plain words and quoted
    strings; NotTranslated for anything bash would expand or interpret (``$``, backquotes, globs,
    operators): verify reads no statement whose words depend on the shell."""
    words: list[str] = []
    word: list[str] | None = None
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c in " \t":
            if word is not None:
                words.append("".join(word))
                word = None
            i += 1
            continue
        word = word if word is not None else []
        if c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise NotTranslated(f"{line!r}: an unterminated single quote")
            word.append(line[i + 1 : end])
            i = end + 1
        elif c == '"':
            i += 1
            while True:
                if i >= n:
                    raise NotTranslated(f"{line!r}: an unterminated double quote")
                d = line[i]
                if d == '"':
                    i += 1
                    break
                if d in "$`":
                    raise NotTranslated(f"{line!r}: {d} inside double quotes is an expansion")
                if d == "\\" and i + 1 < n and line[i + 1] in _DQ_ESCAPABLE:
                    word.append(line[i + 1])
                    i += 2
                    continue
                word.append(d)
                i += 1
        elif c in _UNQUOTED_SPECIAL:
            raise NotTranslated(f"{line!r}: {c!r} outside quotes is interpreted by the shell")
        else:
            word.append(c)
            i += 1
    if word is not None:
        words.append("".join(word))
    if not words:
        raise NotTranslated(f"{line!r}: no words")
    return words


# --- POSIX extended regular expressions (grep -E) as Python's re ---------------------------------

_QUANTIFIERS = set("*+?{")
_INTERVAL = re.compile(r"\{(\d*)(,?)(\d*)\}")
# POSIX classes whose members do not depend on the locale's letters.
_CLASSES = {
    "digit": "0-9",
    "xdigit": "0-9A-Fa-f",
    "space": " \\t\\n\\r\\f\\v",
    "blank": " \\t",
}


def _class_char(c: str) -> str:
    """One literal character inside a Python character class."""
    return "\\" + c if c in "\\]^-[&~|" else c


def _bracket(pattern: str, i: int) -> tuple[str, int]:
    """The bracket expression starting at ``pattern[i] == '['`` as a Python class, and the index after
    it. POSIX: a backslash is literal, ']' first is literal, '-' first or last is literal."""
    j = i + 1
    negate = j < len(pattern) and pattern[j] == "^"
    j += negate
    items: list[str] = []
    first = True
    while True:
        if j >= len(pattern):
            raise NotTranslated(f"{pattern!r}: an unterminated bracket expression")
        c = pattern[j]
        if c == "]" and not first:
            break
        first = False
        if c == "[" and j + 1 < len(pattern) and pattern[j + 1] in ":.=":
            kind = pattern[j + 1]
            end = pattern.find(kind + "]", j + 2)
            name = pattern[j + 2 : end] if end > 0 else ""
            if kind != ":" or name not in _CLASSES:
                raise NotTranslated(f"{pattern!r}: the bracket item [{kind}{name}{kind}] is not translated")
            items.append(_CLASSES[name])
            j = end + 2
            continue
        if j + 2 < len(pattern) and pattern[j + 1] == "-" and pattern[j + 2] != "]":
            lo, hi = c, pattern[j + 2]
            if hi == "[" or ord(lo) > ord(hi):
                raise NotTranslated(f"{pattern!r}: the range {lo}-{hi} is not translated")
            items.append(f"{_class_char(lo)}-{_class_char(hi)}")
            j += 3
            continue
        items.append(_class_char(c))
        j += 1
    return "[" + ("^" if negate else "") + "".join(items) + "]", j + 1


def ere_to_python(pattern: str) -> str:
    """The POSIX extended regular expression ``pattern`` (GNU grep -E) as a Python ``re`` pattern with the
    same matches on a line. Translated: literals, ``.``, bracket expressions (ranges; the locale-free
    classes digit, xdigit, space, blank), groups, ``|``, ``* + ?``, intervals ``{n} {n,} {,m} {n,m}``,
    ``^ $`` and a backslash before a punctuation character (that character). Refused (NotTranslated):
    back-references, GNU's backslash letters (``\\w \\s \\b \\< ...``, whose members follow the locale), a
    quantifier with nothing to repeat or after another one (Python would read ``*+`` as possessive,
    which changes what matches), a ``{`` that is no interval."""
    out: list[str] = []
    i, n = 0, len(pattern)
    # whether the last item can take a quantifier (not at the start, after '(' or '|', or a quantifier)
    atom = False
    depth = 0
    while i < n:
        c = pattern[i]
        if c in _QUANTIFIERS:
            if not atom:
                raise NotTranslated(f"{pattern!r}: {c!r} at {i} has nothing to repeat (or follows a quantifier)")
            if c == "{":
                m = _INTERVAL.match(pattern, i)
                if not m or not (m.group(1) or m.group(3)):
                    raise NotTranslated(f"{pattern!r}: the '{{' at {i} is not an interval")
                if m.group(1) and m.group(3) and int(m.group(1)) > int(m.group(3)):
                    raise NotTranslated(f"{pattern!r}: the interval {m.group(0)} is empty")
                out.append(m.group(0))
                i = m.end()
            else:
                out.append(c)
                i += 1
            atom = False
            continue
        if c == "\\":
            if i + 1 >= n:
                raise NotTranslated(f"{pattern!r}: a trailing backslash")
            d = pattern[i + 1]
            if d.isalnum() or d == "_":
                raise NotTranslated(f"{pattern!r}: \\{d} (a back-reference or a GNU extension) is not translated")
            if d == "<" or d == ">" or d == "`" or d == "'":
                raise NotTranslated(f"{pattern!r}: \\{d} (a GNU anchor) is not translated")
            out.append(re.escape(d))
            i += 2
            atom = True
        elif c == "[":
            cls, i = _bracket(pattern, i)
            out.append(cls)
            atom = True
        elif c == "(":
            out.append("(?:")
            depth += 1
            i += 1
            atom = False
        elif c == ")":
            if depth == 0:
                raise NotTranslated(f"{pattern!r}: an unmatched ')' at {i}")
            depth -= 1
            out.append(")")
            i += 1
            atom = True
        elif c == "|":
            out.append("|")
            i += 1
            atom = False
        elif c in "^$":
            out.append(c)
            i += 1
            atom = False  # GNU lets a quantifier follow an anchor; Python refuses: refused here too
        elif c == ".":
            out.append(".")
            i += 1
            atom = True
        else:
            out.append(re.escape(c))
            i += 1
            atom = True
    if depth:
        raise NotTranslated(f"{pattern!r}: an unmatched '('")
    return "".join(out)


# --- deciding the checks --------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    """A check over a run's log: whether grep found its pattern, whether the check passed, and for a
    failed one the CPU proxy's mechanism that made it fail (None: not the proxy's doing)."""

    check: LogCheck
    found: bool
    proxy_cause: str | None = None
    shim_function: str | None = None  # the proxy shim's function behind proxy_cause
    # evidence: the first line that matched, or for a check_log that found nothing the first line holding the
    # pattern's longest literal text (what the run printed instead; None when no line holds it)
    line: str | None = None

    @property
    def passed(self) -> bool:
        return self.found == self.check.wanted

    def describe(self) -> str:
        what = "found" if self.found else "not found"
        return f"{self.check.describe()}: {what}" + (f" ({self.proxy_cause})" if self.proxy_cause else "")

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"check": self.check.describe(), "found": self.found, "passed": self.passed}
        if self.line is not None:
            out["line" if self.found else "nearest_line"] = self.line
        if self.proxy_cause:
            out["proxy_cause"] = self.proxy_cause
        return out


def log_lines(log: str) -> list[str]:
    """A log as grep reads it: lines split at newlines only (a carriage return is a character)."""
    return log.split("\n")


# What the CPU proxy prints differently from a GPU, each as (the proxy's text, a GPU's, the proxy shim's
# function that answers for it, the mechanism). Used only to explain a failed check (proxy_cause), never to pass one.
PROXY_LINES: tuple[tuple[re.Pattern[str], str, str, str], ...] = (
    (
        re.compile(r"\bRank (\d+), node (\S+), device cpu\b"),
        r"Rank \1, node \2, device \1",
        "current_device",
        "the CPU proxy's shim answers torch.cuda.current_device() with 'cpu' (proxy_shim.install, so that "
        "megatron's tensors made on the current device land on the CPU), where a GPU answers the rank's device "
        "index (its local rank on one node): megatron's rerun state machine prints 'device cpu'",
    ),
)


def proxy_cause(check: LogCheck, lines: list[str]) -> tuple[str, str] | None:
    """The proxy shim's function and mechanism that fail ``check`` on ``lines`` (the check would pass on
    the lines a GPU prints: PROXY_LINES undone), or None."""
    for proxy_text, gpu_text, shim_function, mechanism in PROXY_LINES:
        gpu_lines = [proxy_text.sub(gpu_text, line) for line in lines]
        if gpu_lines != lines and check.found(gpu_lines) == check.wanted:
            return shim_function, mechanism
    return None


def longest_literal(check: LogCheck) -> str:
    """The longest text a line matching ``check`` contains as it is: an -F pattern's longest word, an -E
    pattern's longest run of literal characters (escapes undone; a character a quantifier follows left out)."""
    if check.mode == "-F":
        return max(check.pattern.split(), key=len, default="")
    runs, run, i, p = [], "", 0, check.pattern
    while i < len(p):
        c = p[i]
        if c == "\\" and i + 1 < len(p):
            run, i = run + p[i + 1], i + 2
        elif c in "*?{":
            runs.append(run[:-1])
            run, i = "", i + 1
        elif c in ".[]()+|^$":
            runs.append(run)
            run, i = "", i + 1
        else:
            run, i = run + c, i + 1
    return max([*runs, run], key=len)


# The shortest literal text worth pointing at a line by (shorter ones match lines at random).
_NEAR_MIN = 8


def _evidence(check: LogCheck, found: bool, lines: list[str]) -> str | None:
    """The first matching line (found), else the first line holding the pattern's longest literal text."""
    if found:
        rx = check.matcher()
        hit = next(ln for ln in lines if (rx.search(ln) if rx else check.pattern in ln))
        return hit[:300]
    text = longest_literal(check)
    if len(text) < _NEAR_MIN:
        return None
    return next((ln[:300] for ln in lines if text in ln), None)


def evaluate(script: AfterScript, log: str) -> list[CheckResult]:
    """Every check over ``log`` (upstream's script stops at the first failure; all are reported here)."""
    lines = log_lines(log)
    out = []
    for check in script.checks:
        found = check.found(lines)
        cause = None if found == check.wanted else proxy_cause(check, lines)
        line = _evidence(check, found, lines)
        out.append(CheckResult(check, found, cause[1] if cause else None, cause[0] if cause else None, line))
    return out
