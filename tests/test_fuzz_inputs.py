"""Fuzzing the loaders of every file a user edits (upstream.lock, a series, a patch), as bytes and as
text: whatever the input, a loader returns a valid object or refuses it with BadInput (one line,
naming the file); it never raises anything else. An accepted input is checked to mean what it says.

CI runs a bounded number of examples per target (seconds); the big run sets
ROCMPORT_FUZZ_EXAMPLES (e.g. 10000) and prints how many inputs each target accepted and refused:

    ROCMPORT_FUZZ_EXAMPLES=10000 python -m pytest -q -s tests/test_fuzz_inputs.py
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocmport.errors import BadInput
from rocmport.inputs import has_control, ref_problem
from rocmport.patches.diff import later_step_writes, resolves_inside
from rocmport.patches.series import load_patch, load_series
from rocmport.upstream.lock import Lock, Pin, parse_lock, parse_lock_bytes

EXAMPLES = int(os.environ.get("ROCMPORT_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)

SHA = "55ac7082517c3878ae653c07c09c534b8aed49f6"
LOCK = Lock(
    upstreams={
        "megatron-lm": Pin(
            "https://github.com/NVIDIA/Megatron-LM.git",
            "git",
            "v0.16",
            "core_v0.16.1",
            SHA,
            "2026-03-16T09:59:46+00:00",
            version="0.16.1",
        ),
        "megatron-bridge": Pin(
            "https://github.com/NVIDIA-NeMo/Megatron-Bridge.git",
            "git",
            "companion of core_v0.16.1",
            "v0.3.1",
            "1" * 40,
            "2026-01-01T00:00:00+00:00",
            chosen_by="gitlink-exact",
            version="0.3.1",
        ),
    }
).dumps()
PATCH = (
    "Description: make f return 2\n more words\n .\n last line\nUpstream-Status: Backport 55ac7082\nBug: https://example.org/1\n---\n"
    "diff --git a/megatron/core/utils.py b/megatron/core/utils.py\n"
    "index 0123456789012345678901234567890123456789..9876543210987654321098765432109876543210 100644\n"
    "--- a/megatron/core/utils.py\n+++ b/megatron/core/utils.py\n"
    "@@ -1,3 +1,3 @@\n def f():\n-    return 1\n+    return 2\n # end\n"
    "diff --git a/megatron/core/new.py b/megatron/core/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/megatron/core/new.py\n"
    "@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n"
)
# What a series may allow: a symlink inside the tree, a mode change, a gitlink.
PATCH_ALLOWED = PATCH + (
    "diff --git a/megatron/core/alias.py b/megatron/core/alias.py\nnew file mode 120000\n--- /dev/null\n+++ b/megatron/core/alias.py\n"
    "@@ -0,0 +1 @@\n+utils.py\n\\ No newline at end of file\n"
    "diff --git a/tools/run.sh b/tools/run.sh\nold mode 100644\nnew mode 100755\n"
    "diff --git a/third_party/dep b/third_party/dep\nnew file mode 160000\nindex 0000000..1234567\n--- /dev/null\n+++ b/third_party/dep\n"
    "@@ -0,0 +1 @@\n+Subproject commit 1234567890123456789012345678901234567890\n"
)
SERIES = (
    "upstream: megatron-lm\nline: v0.16\nversions: '>=0.16.0rc0,<0.17.0rc0'  # a comment\npatches:\n  - 0001-f.patch\n"
    "codemods:\n  - apex-to-torch\n  - name: guard-nvidia-only-imports\n    options:\n      packages: {transformer_engine: transformer-engine}\n"
    "excluded_paths: [docs]\nmanifests:\n  drop: {fastapi: not on our image}\n  keep: [mamba-ssm]\n"
    "verify:\n  unit_tests: [tests/unit_tests/models/test_gpt_model.py]\n  known_failures: {tests/unit_tests/test_fp8.py: needs FP8}\n"
    "allow: [mode-changes]\nmax_patch_bytes: 100000\n"
)
# Fragments that mean something to YAML, to a diff or to git, spliced in at random places.
TOKENS = [
    "\n",
    ": ",
    "- ",
    "[",
    "]",
    "{",
    "}",
    "&a ",
    "*a",
    "!!binary ",
    "!!python/object:os.system ",
    "%YAML 1.1\n",
    "\t",
    "\x00",
    "\ufeff",
    "---\n",
    "...",
    "../",
    "/",
    "@@ ",
    "@@ -1,3 +1,3 @@\n",
    "+",
    "-",
    " ",
    "diff --git a/x b/x\n",
    "new file mode 120000\n",
    "new file mode 160000\n",
    "old mode 100644\nnew mode 100755\n",
    "GIT binary patch\nliteral 3\n",
    "a/",
    "b/",
    "\\ No newline at end of file\n",
    "? ",
    "<<: *a\n",
    "true",
    "null",
    "1e400",
    "0x10",
    "'",
    '"',
    "\r\n",
    "\u2028",
    "é",
    "\udcff"[:0],
    "~",
    "yes",
]


@st.composite
def mutated_bytes(draw, seed: str) -> bytes:
    """``seed`` (UTF-8) with a few random byte edits: flips, inserts, deletions, truncation, splices."""
    data = bytearray(seed.encode())
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "splice", "dup"]))
        pos = draw(st.integers(0, len(data)))
        if op == "flip" and data:
            data[min(pos, len(data) - 1)] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
        elif op == "truncate":
            del data[pos:]
        elif op == "splice":
            data[pos:pos] = draw(st.sampled_from(TOKENS)).encode("utf-8", "surrogatepass")
        elif op == "dup" and data:
            end = min(len(data), pos + draw(st.integers(1, 40)))
            data[pos:pos] = data[pos:end]
    return bytes(data)


@st.composite
def mutated_text(draw, seed: str) -> str:
    """``seed`` with line-level edits: lines dropped, duplicated, swapped, replaced by random text or tokens."""
    lines = seed.splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 5))):
        op = draw(st.sampled_from(["drop", "dup", "swap", "replace", "token", "append"]))
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        if not lines:
            lines = [draw(st.text(max_size=20))]
        elif op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "replace":
            lines[i] = draw(st.text(max_size=40)) + "\n"
        elif op == "token":
            cut = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:cut] + draw(st.sampled_from(TOKENS)) + lines[i][cut:]
        else:
            lines.append(draw(st.text(max_size=40)))
    return "".join(lines)


YAML_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=30)
    | st.sampled_from(
        ["core_v0.16.1\n", "../../x", "-x", "v0.16", SHA, "banana", "https://u:TOKEN@h/x", "ext::sh", "0.16", ""]
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)


@st.composite
def retyped(draw, seed: str) -> str:
    """``seed`` (a YAML mapping) with one value somewhere inside replaced by a value of any type."""
    data = yaml.safe_load(seed)
    node, path = data, []
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
        if not keys:
            break
        key = draw(st.sampled_from(keys))
        path.append(key)
        if not isinstance(node[key], (dict, list)) or draw(st.booleans()):
            node[key] = draw(YAML_VALUES)
            break
        node = node[key]
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _tally(stats: Counter, name: str) -> None:
    total = sum(stats.values())
    print(
        f"\nfuzz {name}: {total} inputs, {stats['accepted']} accepted, {stats['refused']} refused with BadInput, 0 crashes"
    )
    assert total >= 1


# -- upstream.lock -------------------------------------------------------------------------------


def check_lock(data: bytes | str, stats: Counter) -> None:
    try:
        lock = parse_lock_bytes(data, "upstream.lock") if isinstance(data, bytes) else parse_lock(data, "upstream.lock")
    except BadInput as exc:
        msg = str(exc)
        assert msg.startswith("upstream.lock") and "\n" not in msg
        stats["refused"] += 1
        return
    stats["accepted"] += 1
    for name, pin in lock.upstreams.items():  # accepted means usable
        assert ref_problem(pin.resolved_ref) is None and not has_control(pin.requested_ref)
        assert len(pin.commit) == 40 and "@" not in pin.url.split("/")[2] if "://" in pin.url else True
    assert parse_lock(lock.dumps()).to_dict() == lock.to_dict()  # it writes back to itself


@pytest.mark.parametrize("kind", ["bytes", "text", "types", "random"])
def test_fuzz_lock_loader(kind):
    stats: Counter = Counter()
    strategy = {
        "bytes": mutated_bytes(LOCK),
        "text": mutated_text(LOCK),
        "types": retyped(LOCK),
        "random": st.binary(max_size=300) | st.text(max_size=300),
    }[kind]

    @FUZZ
    @given(strategy)
    def run(data):
        check_lock(data, stats)

    run()
    _tally(stats, f"lock {kind}")


# -- series and patches ----------------------------------------------------------------------------


def _load_series(series: bytes | str, patch: bytes | str, stats: Counter) -> None:
    with tempfile.TemporaryDirectory(prefix="rocmport-fuzz-") as tmp:
        d = Path(tmp) / "patchsets" / "megatron-lm" / "v0.16"
        d.mkdir(parents=True)
        for name, data in (("series", series), ("0001-f.patch", patch)):
            (d / name).write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
        try:
            s = load_series(d / "series")
        except BadInput as exc:
            assert str(exc).startswith(str(d)) and "\n" not in str(exc)
            stats["refused"] += 1
            return
        stats["accepted"] += 1
        assert s.upstream == "megatron-lm" and len({p.name for p in s.patches}) == len(s.patches)
        assert all(isinstance(c["name"], str) and isinstance(c["options"], dict) for c in s.codemods)
        assert all(isinstance(t, str) for t in s.verify.get("unit_tests", []))


@pytest.mark.parametrize("kind", ["bytes", "text", "types"])
def test_fuzz_series_loader(kind):
    stats: Counter = Counter()
    strategy = {"bytes": mutated_bytes(SERIES), "text": mutated_text(SERIES), "types": retyped(SERIES)}[kind]

    @FUZZ
    @given(strategy)
    def run(data):
        _load_series(data, PATCH, stats)

    run()
    _tally(stats, f"series {kind}")


def _load_patch(data: bytes | str, stats: Counter, allow: frozenset[str] = frozenset()) -> None:
    with tempfile.TemporaryDirectory(prefix="rocmport-fuzz-") as tmp:
        path = Path(tmp) / "0001-f.patch"
        path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
        try:
            patch = load_patch(path, allow=allow, max_bytes=20_000)
        except BadInput as exc:
            assert str(exc).startswith(str(path)) and "\n" not in str(exc)
            stats["refused"] += 1
            return
        stats["accepted"] += 1
        assert patch.files and patch.description and patch.upstream_status
        for f in patch.files:  # accepted means: inside the tree, nothing the series did not allow
            parts = Path(f.path).parts
            assert not Path(f.path).is_absolute() and ".." not in parts and ".git" not in parts
            assert allow or (f.link_target is None and not f.binary and f.new_mode not in ("120000", "160000"))
            if f.link_target is not None:  # even allowed, a link stays inside the tree
                assert resolves_inside(f.path, f.link_target) and later_step_writes(f.path) is None


@pytest.mark.parametrize("kind", ["bytes", "text", "allowing-everything"])
def test_fuzz_patch_loader(kind):
    stats: Counter = Counter()
    strategy = {
        "bytes": mutated_bytes(PATCH),
        "text": mutated_text(PATCH),
        "allowing-everything": mutated_text(PATCH_ALLOWED),
    }[kind]
    allow = (
        frozenset({"binary", "gitlinks", "mode-changes", "symlinks"}) if kind == "allowing-everything" else frozenset()
    )

    @FUZZ
    @given(strategy)
    def run(data):
        _load_patch(data, stats, allow)

    run()
    _tally(stats, f"patch {kind}")


def test_the_seeds_themselves_load(tmp_path):
    """The fuzzers start from valid inputs (so a mutation is a step away from something accepted)."""
    stats: Counter = Counter()
    check_lock(LOCK.encode(), stats)
    _load_series(SERIES, PATCH, stats)
    _load_patch(PATCH, stats)
    _load_patch(PATCH_ALLOWED, stats, frozenset({"binary", "gitlinks", "mode-changes", "symlinks"}))
    assert stats == Counter(accepted=4)
    _load_patch(PATCH_ALLOWED, stats)  # ... and refused when the series does not allow them
    assert stats["refused"] == 1


def test_what_the_10000_example_runs_found_is_refused_in_one_line():
    """Found by the 10,000-example runs: a lock whose upstream name holds newlines put them into the
    error (two lines), and a series' `verify.unit_tests: false` was accepted as no tests."""
    stats: Counter = Counter()
    check_lock("schema_version: 1\nupstreams:\n  ? '\n\n    '\n  : null\n", stats)
    _load_series(
        SERIES.replace("unit_tests: [tests/unit_tests/models/test_gpt_model.py]", "unit_tests: false"), PATCH, stats
    )
    assert stats == Counter(refused=2)
