"""scripts/inject_port_bug.py: each bug's port text is what the codemods write today (the generated
helper, the te-version-gates rewrite), so the script still injects into a fresh port; an injection is
exact and reversible, and a second one is refused with the tree left as it was."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from rocmport.codemods.helper import helper_text
from tests.helpers.codemods import rewrite

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "inject_port_bug.py"

# Shaped like megatron/core/extensions/transformer_engine.py's TEDelayedScaling at core_v0.16.1.
DELAYED_SCALING = """\
import transformer_engine as te

from megatron.core.utils import is_te_min_version


class TEDelayedScaling(te.common.recipe.DelayedScaling):
    def __init__(self, config, fp8_format):
        extra_kwargs = {}
        if is_te_min_version("1.6.0.dev0"):
            extra_kwargs["fp8_dpa"] = config.fp8_dot_product_attention
        super().__init__(fp8_format=fp8_format, **extra_kwargs)
"""


# Shaped like megatron/core/transformer/attention.py's Attention.__init__ at core_v0.19.0 (the FP8 gate
# v0.19's current-scaling case takes).
ATTENTION = """\
from megatron.core.utils import is_te_min_version

try:
    from megatron.core.extensions.transformer_engine import TELinear, set_save_original_input

    HAVE_TE = True
except ImportError:
    HAVE_TE = False


class Attention:
    def __init__(self, config, linear_proj):
        self.config = config
        self.linear_proj = linear_proj
        if (
            HAVE_TE
            and isinstance(self.linear_proj, TELinear)
            and (
                (
                    self.config.fp8
                    and self.config.fp8_recipe != 'delayed'
                    and is_te_min_version("2.6.0dev0")
                )
                or (self.config.fp4 and is_te_min_version("2.7.0.dev0"))
            )
        ):
            set_save_original_input(self.linear_proj)
"""


def _script():
    spec = importlib.util.spec_from_file_location("inject_port_bug", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("inject_port_bug", module)  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _ported_tree(root: Path) -> Path:
    """A git tree holding the three files the bugs edit, as rocmport writes them."""
    te_file, sites = rewrite("te-version-gates", DELAYED_SCALING, "megatron/core/extensions/transformer_engine.py")
    assert sites == 1
    attention, sites = rewrite("te-version-gates", ATTENTION, "megatron/core/transformer/attention.py")
    assert sites == 2
    files = {
        "megatron/core/extensions/transformer_engine.py": te_file,
        "megatron/core/transformer/attention.py": attention,
        "megatron/core/_rocm.py": helper_text(["te-version-gates", "fp8-arch-check"]),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "port"]):
        subprocess.run(["git", *cmd], cwd=root, check=True)
    return root


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


@pytest.mark.parametrize("bug", sorted(_script().BUGS))
def test_each_bug_injects_into_what_the_port_writes_and_reverts(tmp_path, bug):
    tree = _ported_tree(tmp_path)
    spec = _script().BUGS[bug]
    target = tree / spec.path
    before = target.read_text(encoding="utf-8")
    assert before.count(spec.old) == 1  # the codemods still write the text the bug edits

    done = _run("--tree", str(tree), bug)
    assert done.returncode == 0, done.stderr
    after = target.read_text(encoding="utf-8")
    assert after == before.replace(spec.old, spec.new) and after != before

    again = _run("--tree", str(tree), bug)
    assert again.returncode == 2 and str(target) in again.stderr and "--revert" in again.stderr
    assert target.read_text(encoding="utf-8") == after  # the refused run wrote nothing

    undone = _run("--tree", str(tree), "--revert", bug)
    assert undone.returncode == 0, undone.stderr
    assert target.read_text(encoding="utf-8") == before


def test_a_tree_without_the_file_is_refused_naming_it(tmp_path):
    proc = _run("--tree", str(tmp_path), "device-arch-field")
    assert proc.returncode == 2
    assert str(tmp_path / "megatron/core/_rocm.py") in proc.stderr and "ported Megatron-LM tree" in proc.stderr


def test_list_names_every_bug():
    proc = _run("--list")
    assert proc.returncode == 0
    assert {line.split(":")[0] for line in proc.stdout.splitlines()} == set(_script().BUGS)
