"""Stage 3's labels: each failing test of the port against the unported tree's outcome for it
(port-regression, upstream-known, proxy-artifact, needs-nvidia-only, unverified, missing-dependency,
not-run, flaky, known-failure; see runner's docstring)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rocmport.verify.runtime.proxy_causes import cpu_backend_mechanism, in_shim
from rocmport.verify.stages.unit_tests import suite
from rocmport.verify.stages.unit_tests.command import _file
from rocmport.verify.stages.unit_tests.results import SuiteRun, _share_phrase
from rocmport.verify.stages.gpt_training import exhausted

if TYPE_CHECKING:
    pass


def _missing_ordinary(nodeid: str, res: SuiteRun, blocked: tuple[str, ...]) -> str | None:
    """The ordinary package whose absence made this test (or its module) fail, if that is why."""
    import re

    mod = res.missing.get(_file(nodeid)) or res.missing.get(nodeid)
    if not mod:
        m = re.search(r"No module named '([^']+)'", res.details.get(nodeid, ""))
        mod = m.group(1) if m else None
    return mod if mod and mod.split(".")[0] not in blocked else None


# How megatron's messages name a package besides its module name and distribution spelling.
_ALIASES = {"transformer_engine": r"\bTE\b|Transformer ?Engine", "flash_attn": r"flash[- ]attn|FlashAttention"}


def _names_blocked(nodeid: str, res: SuiteRun, blocked: tuple[str, ...]) -> str | None:
    """The firewalled package this failure names, if any: the module it found missing, or its
    message. Names that are also ordinary words (`cuda`, `nvidia`, `apex`: torch.cuda, "Apex is not
    installed") count only as a missing module; distinctive ones (`transformer_engine`) also as
    written, as their distribution spells them (`nvidia-resiliency-ext`) and by megatron's aliases."""
    import re

    for mod in (res.missing.get(_file(nodeid)), res.missing.get(nodeid)):
        if mod and mod.split(".")[0] in blocked:
            return mod.split(".")[0]
    text = res.details.get(nodeid, "")
    for mod in blocked:
        patterns = [rf"No module named '{re.escape(mod)}\b"]
        if "_" in mod:
            patterns += [rf"\b{re.escape(mod)}\b", rf"\b{re.escape(mod.replace('_', '-'))}\b"]
        if mod in _ALIASES:
            patterns.append(_ALIASES[mod])
        if any(re.search(p, text) for p in patterns):
            return mod
    return None


# The machine's limits, as the C library and Python word them: threads (EAGAIN from pthread_create,
# as gloo reports a group it could not start), file descriptors, memory.
def _te_kernel_missing(nodeid: str, res: SuiteRun) -> str | None:
    """The transformer_engine_torch function whose missing CPU implementation failed this test, if that is why."""
    m = re.search(r"unsupported-in-proxy: (transformer_engine_torch\.\w+)", res.details.get(nodeid, ""))
    return m.group(1) if m else None


def _exhausted(nodeid: str, res: SuiteRun) -> str | None:
    """The resource-exhaustion message this failure carries, if any: the machine's limit, not upstream's bug."""
    return exhausted(res.details.get(nodeid, ""))


def label(
    port: SuiteRun, base: SuiteRun, known: dict[str, str], blocked: tuple[str, ...] = ()
) -> tuple[dict[str, str], dict[str, str]]:
    """Each failing test of the port: its label (see the module docstring) and why."""
    labels, why = {}, {}
    for nodeid, outcome in port.outcomes.items():
        if outcome not in ("failed", "error"):
            continue
        lab, text = _label_one(nodeid, port, base, known, blocked)
        if nodeid in port.hung and port.machine and port.machine.get("overloaded"):
            text += f" (on an overloaded machine: {_share_phrase(port.machine)})"  # the verdict may be the machine's
        labels[nodeid], why[nodeid] = lab, text
    return labels, why


def _label_one(
    nodeid: str, port: SuiteRun, base: SuiteRun, known: dict[str, str], blocked: tuple[str, ...]
) -> tuple[str, str]:
    """One failing test's label and why, by what the unported tree did with it."""
    listed = next((k for k in known if suite.matches(nodeid, k)), None)
    missing = _missing_ordinary(nodeid, port, blocked)
    b = base.outcomes.get(nodeid)
    b_module = base.outcomes.get(_file(nodeid))
    if missing:
        return "missing-dependency", f"the ordinary package {missing.split('.')[0]} is not installed"
    if listed:
        return "known-failure", known[listed]
    if kernel := _te_kernel_missing(nodeid, port):
        # TE's Python layer reached a compiled kernel the proxy's CPU layer does not implement
        # (verify --te): the proxy's gap, named; never the port's failure nor a firewalled package's.
        return (
            "proxy-artifact",
            f"unsupported-in-proxy: the CPU proxy's TE layer has no reference implementation of {kernel}; not verified here",
        )
    if nodeid in port.hung:
        return _label_hung(nodeid, port, base)
    if b in ("passed", "skipped"):
        return "port-regression", f"{b} on the unported tree"
    if b in ("failed", "error"):
        return _label_failed_on_both(nodeid, port, base, blocked)
    if (
        _file(nodeid) == nodeid
        and b_module is None
        and (ran_there := [k for k in base.outcomes if _file(k) == nodeid and k != nodeid])
    ):
        # its module does not import on the port; on the unported tree it imported and its tests ran
        return (
            "port-regression",
            f"its module does not import here; on the unported tree it imported and {len(ran_there)} of its tests ran",
        )
    if b_module == "error" and _file(nodeid) != nodeid:
        return (
            "unverified",
            f"its module does not import on the unported tree: {base.details.get(_file(nodeid), '')[:200]}",
        )
    base_file = base.files.get(_file(nodeid))
    return (
        "unverified",
        "the unported tree has no outcome for it"
        + (
            f" (it did not run there: {base_file.reason})"
            if base_file is not None and base_file.status == "not-run"
            else ""
        ),
    )


def _label_hung(nodeid: str, port: SuiteRun, base: SuiteRun) -> tuple[str, str]:
    """A test that hung in the port's suite: by its rerun alone, and the unported tree's outcome."""
    again = port.alone.get(nodeid)
    b = base.outcomes.get(nodeid)
    if again == "passed":
        return "flaky", "hung in the suite, passed when rerun alone"
    if again == "hung" and (nodeid in base.hung and base.alone.get(nodeid) in ("hung", None)):
        return "flaky", "hangs on the port and on the unported tree"
    if again == "hung" and b in ("passed", "skipped"):
        return "port-regression", "hangs on the port (alone too); passes on the unported tree"
    alone_words = {
        "failed": "failed when rerun alone",
        "error": "errored when rerun alone",
        "hung": "hung again when rerun alone",
        "skipped": "was skipped when rerun alone",
    }.get(again or "", "was not rerun alone")
    base_words = (
        "the unported tree has no outcome for it"
        if not b
        else "the unported tree hung in it too"
        if nodeid in base.hung
        else f"the unported tree {b} it without hanging"
        if b in ("failed", "passed", "skipped")
        else f"on the unported tree: {b}"
    )
    return "unverified", f"it hung in the suite and {alone_words}; {base_words}"


def _label_failed_on_both(nodeid: str, port: SuiteRun, base: SuiteRun, blocked: tuple[str, ...]) -> tuple[str, str]:
    """A test that fails on both trees: the same way (why: upstream's, the proxy's, the firewall's) or
    not: another exception type (unverified, unless the port's failure is the CPU backend's named lack:
    proxy-artifact), or the same type raised with another message (the port's)."""
    base_kind, hung_there = base.kinds.get(nodeid), False
    if nodeid in base.hung and nodeid in base.alone_kinds:
        # it hung in the unported tree's suite and failed when rerun alone: that failure is its outcome there
        base_kind = base.alone_kinds[nodeid]
        hung_there = True
    if port.kinds.get(nodeid) != base_kind:
        if cpu := cpu_backend_mechanism(_message_and_site(port.details.get(nodeid, ""))[0]):
            # The port went past the unported tree's failure (an incompatibility it fixed) to what
            # the CPU proxy lacks, named (measured on v0.19, TE 2.17.1: test_te_layers_batch_invariant.py,
            # `general_gemm() got an unexpected keyword argument 'workspace'` there, the batch-invariant
            # GEMM's "requires CUDA tensors" here): the proxy's gap, not the port's failure nor upstream's.
            there = _message_and_site(base.details.get(nodeid, ""))[0][:160]
            return (
                "proxy-artifact",
                f"fails differently on the unported tree ({base_kind or '?'} there"
                + (f": {there}" if there else "")
                + f"); here it fails further on, through {cpu}: the proxy's gap, not verified here",
            )
        return (
            "unverified",
            f"fails differently on the unported tree ({base_kind or '?'} there, {port.kinds.get(nodeid) or '?'} here)",
        )
    if exhausted := _exhausted(nodeid, port):
        return (
            "proxy-artifact",
            f"fails the same way on the unported tree: this machine ran out of a resource "
            f"({exhausted}), here under the CPU proxy's load (gloo groups' threads on 8 ranks)",
        )
    if not hung_there and messages_differ(nodeid, port, base):
        # (a hang's rerun alone keeps its type, not its message: that comparison stays by type)
        return _label_other_message(nodeid, port, base, blocked)
    if nodeid in set(port.local_spec):
        return "proxy-artifact", "fails the same way on the unported tree, running with the local spec in place of TE's"
    if _raised_in_shim(port.details.get(nodeid, "")) and _raised_in_shim(base.details.get(nodeid, "")):
        return (
            "proxy-artifact",
            "fails the same way on the unported tree, raised in the CPU proxy's shim "
            f"(rocmport/verify/runtime/proxy_shim.py): what the proxy does not provide, not upstream's failure "
            f"({_message_and_site(port.details[nodeid])[0][:160]})",
        )
    if cpu := cpu_backend_mechanism(_message_and_site(port.details.get(nodeid, ""))[0]):
        return "proxy-artifact", f"fails the same way on the unported tree, through {cpu}: not upstream's failure"
    if needs := _names_blocked(nodeid, port, blocked):
        return (
            "needs-nvidia-only",
            f"fails the same way on the unported tree: it needs {needs}, which the firewall removes here",
        )
    return (
        "upstream-known",
        "fails the same way on the unported tree"
        + (" (there when rerun alone: it hung in the suite)" if hung_there else ""),
    )


def _on_baseline(nodeid: str, base: SuiteRun, port: SuiteRun | None = None) -> str:
    """What the unported tree did with this test: its outcome (with its failure's message where the
    port failed it with another one), its module's error, or why it did not run."""
    out = base.outcomes.get(nodeid)
    if out and port is not None and _failed_otherwise(nodeid, port, base):
        return f"{out}: {base.details[nodeid]}"
    if out:
        return out
    if base.outcomes.get(_file(nodeid)) == "error":
        return f"module error: {base.details.get(_file(nodeid), '')}"
    account = base.files.get(_file(nodeid))
    if account is not None and account.status == "not-run":
        return f"not run: {account.reason}"
    if (
        "::" not in nodeid and account is not None and account.status == "ran"
    ):  # a file (not-run here): what its tests did there
        return "ran: " + (", ".join(f"{n} {k}" for k, n in account.counts.items()) or account.reason)
    return "not run"


def _label_other_message(nodeid: str, port: SuiteRun, base: SuiteRun, blocked: tuple[str, ...]) -> tuple[str, str]:
    """A failure of the same type on both trees, raised with another message on the port. Both trees
    run the same test files (the port's) in the same environment: the library the port rewrote is
    what differs, so the port's failure is its own (found on a hop of main: the port's `cannot import
    name 'HAVE_TEE'` where the unported tree's module stopped at "Transformer Engine is not
    installed"), unless both messages name a firewalled package (the port's guard let the import go
    further, to megatron's own word for the same absence) or the port's names the CPU backend's lack
    (it went further, to what the proxy does not have)."""
    here, there = port.details[nodeid], base.details[nodeid]
    both = f"here: {here}; on the unported tree: {there}"
    if (needs := _names_package(here, blocked)) and _names_package(there, blocked) == needs:
        return (
            "needs-nvidia-only",
            f"fails on both trees for want of {needs}, which the firewall removes here, in other words ({both})",
        )
    if cpu := cpu_backend_mechanism(_message_and_site(here)[0]):
        # The same type, and here the CPU backend's named lack: the port got past what stopped the
        # unported tree to what the proxy lacks (v0.19, TE 2.17.1: test_attention.py's TE tests, "Found
        # no NVIDIA driver on your system" here, a RuntimeError of TE's API there), as a failure of
        # another type is (_label_failed_on_both). On a GPU the call has its device: not the port's.
        return (
            "proxy-artifact",
            f"fails with another message on the unported tree ({_message_and_site(there)[0][:160]}); here it "
            f"fails through {cpu}: the proxy's gap, not verified here",
        )
    what = "its module does not import" if _file(nodeid) == nodeid else "it fails"
    return "port-regression", f"{what} with another message than on the unported tree ({both})"


def _names_package(text: str, blocked: tuple[str, ...]) -> str | None:
    """The firewalled package ``text`` names as a package (missing, as its distribution spells it, by
    megatron's aliases), not as the last part of a module or file of the tree:
    `megatron.core.extensions.transformer_engine` is megatron's own module, there with or without TE."""
    for mod in blocked:
        bare = rf"(?<![\w./]){re.escape(mod)}\b"
        patterns = [rf"No module named '{re.escape(mod)}\b"]
        if "_" in mod:
            patterns += [bare, rf"(?<![\w./]){re.escape(mod.replace('_', '-'))}\b"]
        if mod in _ALIASES:
            patterns.append(_ALIASES[mod])
        if any(re.search(p, text) for p in patterns):
            return mod
    return None


# What two runs of the same failure write differently. Paths: the port's tree and the unported
# checkout (a temporary directory; a cached baseline's from an earlier run) live in different
# places, and a site outside the tree is written relative to each run's working directory
# ("../../.venv/..."): a path keeps what follows its last tree-level directory. Line numbers: the
# port rewrote the files its codemods and patches touched, and an inserted import moves every line
# below it, so `file.py:123` (and a traceback's `line 123`) names the same statement on both trees
# at different numbers: they are dropped, the file kept. Object addresses (`at 0x7f...`), the
# random parts of temporary directories' names, a rendezvous's host:port and process ids differ
# from run to run. A test's failure (not a module's import error) is compared without its numbers:
# the values an assertion prints are not reproducible from run to run (on the line matrix's v0.15,
# test_optimizer.py::test_chained_optimizer fails on both trees with `assert False + where False =
# tensor([[[[-1.0840e-02, ...` here and `tensor([[[[-8.0444e-04, ...` there): its words, names and
# site are compared. An import error's message carries no such values and is compared whole.
_PATH_TOKEN = re.compile(r"""[^\s'"()\[\],]*/[^\s'"()\[\],]*""")
# rocmport's own files (the proxy shim a failure is raised through) are written relative to each tree's
# working directory too, at another depth for the unported tree's checkout ("../../../../main/rocmport/..."
# here, "../../../../work/main/rocmport/..." there): they keep what follows rocmport/.
_TREE_DIR = re.compile(r"(?:^|.*/)((?:megatron|tests|examples|tools|site-packages|dist-packages|rocmport)/.*)$")
_LINE = re.compile(r"""(\.pyx?"?)(?::\d+|, line \d+)""")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]+\b")
_TEMP_NAME = re.compile(r"\b(pytest-|tmp|rocmport-[a-z]+-)(?:\d+\b|[a-z0-9_]{8}\b)")
_ENDPOINT = re.compile(r"\[?\b(?:\d{1,3}\.){3}\d{1,3}\]?:\d+|\[?localhost\]?:\d+")
_PID = re.compile(r"\b(pid\s*[=:]?\s*)\d+", re.I)
_NUMBER = re.compile(r"(?<!\w)[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?")
# _failure_line (pytest_plugin) keeps 240 characters of a test's message (then its site, " at
# FILE:LINE") and 300 of a collection error's line; a longer tree path in it cuts it earlier
_KEPT = 240
_SITE = re.compile(r"^(.*) at (\S+):\d+$", re.S)


def _normalised(text: str, numbers: bool = True) -> str:
    text = _LINE.sub(r"\1", text)
    text = _PATH_TOKEN.sub(lambda m: (t := _TREE_DIR.match(m.group(0))) and t.group(1) or m.group(0), text)
    text = _TEMP_NAME.sub(r"\1*", _ADDRESS.sub("0x*", text))
    text = _PID.sub(r"\1*", _ENDPOINT.sub("HOST:PORT", text))
    if not numbers:  # with its sign, or the space torch pads a positive value with (`[ 6.7e-03`, `... 3.4e-03`)
        text = re.sub(r"([\[(.])\s+#", r"\1#", _NUMBER.sub("#", text))
    return " ".join(text.removeprefix("E ").split())


def _raised_in_shim(line: str) -> bool:
    """Whether a failure line's site (pytest_plugin._failure_line's innermost frame, past the shim's
    pass-through: proxy_causes.without_hand_ons) is the CPU proxy's shim, acting."""
    return in_shim(_message_and_site(line)[1])


def _message_and_site(line: str) -> tuple[str, str]:
    found = _SITE.match(line)
    return (found.group(1), found.group(2)) if found else (line, "")


def same_message(here: str, there: str, numbers: bool = True) -> bool:
    """Whether two failure lines (pytest_plugin._failure_line's) say the same thing, once normalised
    (see above; ``numbers``: False for a test's failure, whose values are not compared). A message
    the plugin may have cut short is compared up to where the shorter one was cut, less the word
    the cut may have split (a path, cut at another place on each tree)."""
    (a, a_site), (b, b_site) = _message_and_site(here), _message_and_site(there)
    if _normalised(a_site) != _normalised(b_site):
        return False
    cut = max(len(a), len(b)) >= _KEPT
    a, b = _normalised(a, numbers), _normalised(b, numbers)
    if a == b or not cut:
        return a == b
    kept = min(a, b, key=len).rsplit(" ", 1)[0]
    return len(kept) > 0 and a.startswith(kept) and b.startswith(kept)


def _failed_otherwise(nodeid: str, port: SuiteRun, base: SuiteRun) -> bool:
    """Whether both trees failed this test (or module), each with its message recorded, and not the
    same way (another type or another message). A hang's record is the watchdog's, not a failure's."""
    here, there = port.details.get(nodeid, ""), base.details.get(nodeid, "")
    return (
        bool(here and there)
        and port.outcomes.get(nodeid) in ("failed", "error")
        and base.outcomes.get(nodeid) in ("failed", "error")
        and "hang" not in (port.kinds.get(nodeid), base.kinds.get(nodeid))
        and (
            port.kinds.get(nodeid) != base.kinds.get(nodeid)
            or not same_message(here, there, numbers=_file(nodeid) == nodeid)
        )
    )


def messages_differ(nodeid: str, port: SuiteRun, base: SuiteRun) -> bool:
    """Whether both trees failed this test (or module) with the same exception type and other messages.
    A record without the message (a hang's, an older cache's) is compared by type alone."""
    return port.kinds.get(nodeid) == base.kinds.get(nodeid) and _failed_otherwise(nodeid, port, base)
