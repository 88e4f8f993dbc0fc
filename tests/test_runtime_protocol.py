"""verify/runtime/protocol.py: what the parent writes, a started process reads back, typed; and the
docs page is the declaration's table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rocmport.verify.runtime import protocol

DOCS = Path(__file__).resolve().parents[1] / "docs" / "runtime-protocol.md"


def test_a_started_process_reads_back_what_the_parent_wrote():
    """Each kind across a real process boundary: the environment is the only channel."""
    env = {
        "PATH": "/usr/bin:/bin",
        **protocol.PROXY.entry(True),
        **protocol.BASELINE_GUARDS.entry(False),
        **protocol.FIREWALL.entry(("transformer_engine", "apex")),
        **protocol.UNIT_TEST_TIMEOUT.entry(45.0),
        **protocol.HIP_SIM.entry("7.1.25424-4179531dcd"),
    }
    code = (
        "import json\nfrom rocmport.verify.runtime import protocol as p\n"
        "print(json.dumps([p.PROXY.read(), p.BASELINE_GUARDS.read(), p.FIREWALL.read(), "
        "p.UNIT_TEST_TIMEOUT.read(), p.HIP_SIM.read(), p.TE.read(), p.UNIT_TEST_TIMEOUT.raw()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [
        True,
        False,
        ["transformer_engine", "apex"],
        45.0,
        "7.1.25424-4179531dcd",
        None,
        "45",
    ]


def test_an_empty_value_reads_as_unset_and_unset_removes_it():
    env = {protocol.TE.name: "", protocol.PORT_SITES.name: "/tmp/sites"}
    assert protocol.TE.read(env) is None and protocol.TE.raw(env) == ""
    protocol.PORT_SITES.unset(env)
    assert protocol.PORT_SITES.read(env) is None and protocol.PORT_SITES.name not in env
    protocol.SHIM_CHILDREN.set(env, True)
    assert env[protocol.SHIM_CHILDREN.name] == "1"


def test_the_docs_page_is_the_declaration():
    """docs/runtime-protocol.md carries `protocol.markdown()` verbatim; to refresh it after a change
    to the declaration: `python -m rocmport.verify.runtime.protocol` and paste the table."""
    assert protocol.markdown() in DOCS.read_text(encoding="utf-8")


def test_the_docs_page_names_each_variable_that_is_not_the_protocol():
    from tests.test_architecture import NOT_PROTOCOL

    page = DOCS.read_text(encoding="utf-8")
    assert [n for n in NOT_PROTOCOL if f"| `{n}` |" not in page] == []
