"""Upstream's AFTER_SCRIPT checks (rocmport/verify/stages/after_script.py): read from the YAML as upstream
writes them, anything else refused by name; decided with grep's semantics, the ERE translation held to
the real `grep -E` line by line; a check the CPU proxy fails by itself told apart."""

from __future__ import annotations

import shutil
import subprocess
import textwrap

import pytest
import yaml

from rocmport.verify.stages import after_script as af

# Shaped like upstream's gpt3_mcore_reruns_transient / _disable / _persistent_1 (core_v0.16.1 to main).
TRANSIENT = textwrap.dedent("""\
    MODEL_ARGS:
      --rerun-mode: validate_results
    AFTER_SCRIPT: |
      check_log() { if [[ -z $(grep -r $1 "$2" $LOG_DIR) ]]; then exit 1; else echo OK; fi }
      check_log -F "WARNING:megatron.core.rerun_state_machine:Result validation enabled"
      check_log -E "ERROR:megatron\\.core\\.rerun_state_machine:Rank [0-9]+, node ([0-9a-z]|\\-)+, device [0-9]+: Possible transient error!!"
      EXIT_CODE=0
    TEST_TYPE: regular
    """)
DISABLE = textwrap.dedent("""\
    AFTER_SCRIPT: |
      check_log() { if [[ -z $(grep -r $1 "$2" $LOG_DIR) ]]; then exit 1; else echo OK; fi }
      check_log_not() { if [[ -z $(grep -r $1 "$2" $LOG_DIR) ]]; then echo OK; else exit 1; fi }
      check_log_not -F "WARNING:megatron.core.rerun_state_machine:Result validation enabled"
      check_log -F "Setting rerun_state_machine.current_iteration to 0..."
      EXIT_CODE=0
    """)


def script(text: str) -> af.AfterScript:
    return af.parse(yaml.safe_load(text)["AFTER_SCRIPT"])


def test_upstreams_idioms_are_read_from_the_yaml_with_bash_quoting():
    got = script(TRANSIENT)
    assert got.exit_zero
    assert [c.function for c in got.checks] == ["check_log", "check_log"]
    assert got.checks[0].pattern == "WARNING:megatron.core.rerun_state_machine:Result validation enabled"
    # inside double quotes bash keeps a backslash before '.' and '-': grep gets them
    assert got.checks[1].mode == "-E"
    assert got.checks[1].pattern.startswith("ERROR:megatron\\.core\\.rerun_state_machine:Rank [0-9]+")
    assert "([0-9a-z]|\\-)+" in got.checks[1].pattern
    dis = script(DISABLE)
    assert [(c.function, c.wanted) for c in dis.checks] == [("check_log_not", False), ("check_log", True)]


@pytest.mark.parametrize(
    "statement, words",
    [
        ('echo "$LOG_DIR"', "expansion"),
        ("grep -r foo $LOG_DIR", "outside quotes"),
        ("EXIT_CODE=1", "outside quotes"),
        ('check_log -i "x"', "-F TEXT or -E REGEX only"),
        ('check_log -F "a" "b"', "-F TEXT or -E REGEX only"),
        ('check_log -E "\\w+ error"', "not translated"),
        ('check_log -F "$HOME"', "expansion"),
        ("rm -rf /tmp/x", "not one of upstream's check idioms"),
    ],
)
def test_any_other_statement_is_refused_naming_it(statement, words):
    text = 'check_log() { if [[ -z $(grep -r $1 "$2" $LOG_DIR) ]]; then exit 1; else echo OK; fi }\n' + statement
    with pytest.raises(af.NotTranslated) as e:
        af.parse(text)
    assert words in str(e.value)
    assert statement.split()[0] in str(e.value)


def test_a_check_called_before_its_function_is_defined_is_refused():
    with pytest.raises(af.NotTranslated, match="before the script defines it"):
        af.parse('check_log_not -F "x"\n')


def test_a_function_defined_otherwise_than_upstream_writes_it_is_refused():
    # the same name with the branches swapped is another function: verify does not guess what it does
    other = 'check_log() { if [[ -z $(grep -r $1 "$2" $LOG_DIR) ]]; then echo OK; else exit 1; fi }'
    with pytest.raises(af.NotTranslated, match="defines a function otherwise"):
        af.parse(other)


def test_shell_words_follow_bash_quoting():
    assert af.shell_words("check_log -F 'a \"b\" $c'") == ["check_log", "-F", 'a "b" $c']
    assert af.shell_words('check_log -F "a \\"b\\" \\\\ \\. c"') == ["check_log", "-F", 'a "b" \\ \\. c']
    assert af.shell_words("x \"a\"b'c'") == ["x", "abc"]


LINES = [
    "ERROR:megatron.core.rerun_state_machine:Rank 3, node vm-1, device 3, iteration #2: Possible transient error!!",
    "ERROR:megatron.core.rerun_state_machine:Rank 3, node VM_1, device 3, iteration #2: Possible transient error!!",
    "ERROR:megatron.core.rerun_state_machine:Rank 0, node vm, device cpu, iteration #2: Possible transient error!!",
    "ERRORXmegatron.core.rerun_state_machine:Rank 0, node vm, device 0: Possible transient error!!",
    "a]b",
    "a\\b",
    "x{2}y",
    "xxy",
    "a-b",
    "tab\there",
    "^anchored$",
    "ab|cd",
    "(paren)",
    "",
    "carriage\rreturn",
    "dot.star",
    "abcabc",
    "]",
    "AZ09fz",
]
PATTERNS = [
    "ERROR:megatron\\.core\\.rerun_state_machine:Rank [0-9]+, node ([0-9a-z]|\\-)+, device [0-9]+: Possible transient error!!",
    "ERROR:megatron.core",
    "a[]]b",
    "a[\\]b",
    "[^a-z]",
    "x{2}y",
    "x\\{2\\}y",
    "^x{1,}y$",
    "x{,1}y",
    "a[-x]b",
    "a[x-]b",
    "[[:digit:]]",
    "[[:space:]]here",
    "[[:xdigit:]]{2}",
    "^$",
    "\\^anchored\\$",
    "ab\\|cd",
    "ab|cd",
    "\\(paren\\)",
    "(ab|c)+c",
    "(abc){2}",
    "carriage.return",
    "dot\\.star",
    "o?t\\.s",
    "^]$",
    "[]]",
    "[A-Z]+[0-9]",
]


@pytest.mark.skipif(shutil.which("grep") is None, reason="needs grep")
@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_ere_translation_matches_the_lines_real_grep_matches(pattern, tmp_path):
    log = tmp_path / "stdout.log"
    log.write_bytes("\n".join(LINES).encode() + b"\n")
    for mode in ("-E", "-F"):
        proc = subprocess.run(
            ["grep", "-n", mode, "--", pattern, str(log)], capture_output=True, env={"LC_ALL": "C.UTF-8"}
        )
        assert proc.returncode in (0, 1), proc.stderr
        # grep -n's line numbers (bytes: a carriage return inside a line stays in it)
        by_grep = sorted(int(hit.split(b":", 1)[0]) - 1 for hit in proc.stdout.split(b"\n") if hit)
        check = af.LogCheck("check_log", mode, pattern)
        ours = sorted(i for i, line in enumerate(LINES) if check.found([line]))
        assert ours == by_grep, (mode, pattern)


@pytest.mark.parametrize(
    "pattern, words",
    [
        ("a\\1", "back-reference"),
        ("\\<word", "GNU anchor"),
        ("*a", "nothing to repeat"),
        ("a**", "nothing to repeat"),
        ("a*+", "nothing to repeat"),
        ("(+a)", "nothing to repeat"),
        ("a{x}", "not an interval"),
        ("a{2,1}", "empty"),
        ("[[:alpha:]]", "not translated"),
        ("[a", "unterminated"),
        ("(a", "unmatched"),
    ],
)
def test_what_does_not_translate_exactly_is_refused(pattern, words):
    with pytest.raises(af.NotTranslated, match=words.replace("(", "\\(")):
        af.ere_to_python(pattern)


def test_checks_decide_over_the_log_lines_and_say_what_was_found():
    got = script(DISABLE)
    log = "x\nWARNING:megatron.core.rerun_state_machine:Result validation enabled\nSetting rerun_state_machine.current_iteration to 0...\n"
    results = af.evaluate(got, log)
    assert [(r.found, r.passed) for r in results] == [(True, False), (True, True)]
    assert results[0].proxy_cause is None


def test_a_check_only_the_proxys_device_answer_fails_is_the_proxys_doing():
    # megatron's rerun state machine (core_v0.16.1 log_failure): "Rank {rank}, node {node}, device {device},
    # iteration #{n}: {message}!", device from torch.cuda.current_device(), which the proxy answers 'cpu'
    line = (
        "ERROR:megatron.core.rerun_state_machine:Rank 1, node vm, device cpu, iteration #2: Possible transient error!!"
    )
    by_device = af.AfterScript(
        (af.LogCheck("check_log", "-E", "Rank [0-9]+, node [a-z]+, device [0-9]+, iteration"),), True
    )
    (got,) = af.evaluate(by_device, line + "\n")
    assert not got.passed
    assert got.proxy_cause is not None and "current_device" in got.proxy_cause
    # upstream's transient regex wants "device N: Possible ..." with no ", iteration #N" between: the line
    # megatron prints does not match it on any device, so that failure is not the proxy's doing
    first, second = af.evaluate(
        script(TRANSIENT), "WARNING:megatron.core.rerun_state_machine:Result validation enabled\n" + line
    )
    assert first.passed and not second.passed
    assert second.proxy_cause is None
    # nor is a line the code never printed
    (missing,) = af.evaluate(by_device, "Rank 1, node vm, device cpu: nothing else\n")
    assert not missing.passed and missing.proxy_cause is None


def test_each_check_shows_the_line_it_matched_or_the_nearest_the_run_printed():
    transient = script(TRANSIENT)
    line = (
        "ERROR:megatron.core.rerun_state_machine:Rank 1, node vm, device cpu, iteration #2: Possible transient error!!"
    )
    log = "noise\nWARNING:megatron.core.rerun_state_machine:Result validation enabled\n" + line + "\n"
    first, second = af.evaluate(transient, log)
    assert first.to_dict()["line"] == "WARNING:megatron.core.rerun_state_machine:Result validation enabled"
    # the regex's longest literal run is its prefix: the line holding it is what the run printed instead
    assert second.to_dict()["nearest_line"] == line
    assert af.longest_literal(transient.checks[1]) == "ERROR:megatron.core.rerun_state_machine:Rank "
    (disable_not, disable) = af.evaluate(
        script(DISABLE), "Overwriting rerun_state_machine.current_iteration from 0 to 5...\n"
    )
    assert disable.to_dict()["nearest_line"] == "Overwriting rerun_state_machine.current_iteration from 0 to 5..."
    assert "line" not in disable_not.to_dict() and "nearest_line" not in disable_not.to_dict()
