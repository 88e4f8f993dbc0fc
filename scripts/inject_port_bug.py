"""Inject one of a few known port bugs into a ported Megatron-LM tree, or take it out again: the
mistakes that show stage 4's `--cases reach` catching a port bug in a code path only a non-default
case takes (docs/reach.md, "Injected port bugs").

    python scripts/inject_port_bug.py --list
    python scripts/inject_port_bug.py --tree build/megatron-lm BUG            # inject it
    python scripts/inject_port_bug.py --tree build/megatron-lm --revert BUG   # the file as the tree's HEAD has it

Each bug is one small, plausible edit of the ported tree's code: a site a codemod rewrote, or the
helper the codemods generate (megatron/core/_rocm.py). They lie on the path of upstream's FP8 cases,
the only runnable cases that reach a port site the default case (gpt3_mcore_te_tp2_pp2) does not: the
default case never builds an FP8 recipe and never gets past check_fp8_for_arch's first line (no
--fp8-format). The first three are v0.16's (delayed scaling), the last two v0.19's (its one runnable
FP8 case is current scaling); device-arch-field is on both lines' path.

An edit is exact text: a tree where the text is not found exactly once (another line, a bug already
injected) is exit 2, naming the file, and the tree is left as it was. The edit is not committed:
`--revert` checks the file out of the tree's HEAD (the port `rocmport apply` made)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Bug:
    path: str  # the file, relative to the tree
    old: str  # the port's text, found exactly once
    new: str  # the mistake
    what: str  # the mistake, in words
    where: str  # the site or helper, and why only an FP8 delayed-scaling case runs it


BUGS = {
    "te-gate-missing-kwarg": Bug(
        "megatron/core/extensions/transformer_engine.py",
        'te_gate(is_te_min_version("1.6.0.dev0"), "common.recipe.DelayedScaling", "fp8_dpa")',
        'te_gate(is_te_min_version("1.6.0.dev0"), "common.recipe.DelayedScaling")',
        "the rewritten version gate lost its keyword argument (a TypeError when the recipe is built)",
        "TEDelayedScaling.__init__ te_gate#1 [te-version-gates]: built only with --fp8-format and the delayed recipe",
    ),
    "fp8-recipes-gfx942": Bug(
        "megatron/core/_rocm.py",
        '"gfx942": ("delayed", "tensorwise", "custom"),',
        '"gfx942": ("tensorwise", "custom"),',
        "fp8-arch-check's table lost delayed scaling on gfx942 (the port refuses a recipe MI300X runs)",
        "_rocm.check_fp8_for_arch past its `not args.fp8` return: only a case with --fp8-format",
    ),
    "device-arch-field": Bug(
        "megatron/core/_rocm.py",
        'return name.split(":")[0] or None',
        'return name.split(":")[-1] or None',
        "device_arch() reads the last field of gcnArchName ('xnack-') instead of the first ('gfx942')",
        "_rocm.device_arch, called by check_fp8_for_arch only: only a case with --fp8-format",
    ),
    # v0.19: its one runnable FP8 case is current scaling (tensorwise), so the delayed recipe's gate
    # above never runs there; these two lie on the tensorwise path.
    "attention-fp8-gate-missing-kwarg": Bug(
        "megatron/core/transformer/attention.py",
        'te_gate(is_te_min_version("2.6.0dev0"), "pytorch.Linear", "save_original_input")',
        'te_gate(is_te_min_version("2.6.0dev0"), "pytorch.Linear")',
        "the rewritten version gate lost its keyword argument (a TypeError when the attention is built)",
        "Attention.__init__ te_gate#1 [te-version-gates]: taken only with --fp8-format and a recipe other "
        "than delayed (v0.19)",
    ),
    "fp8-recipes-gfx942-tensorwise": Bug(
        "megatron/core/_rocm.py",
        '"gfx942": ("delayed", "tensorwise", "custom"),',
        '"gfx942": ("delayed", "custom"),',
        "fp8-arch-check's table lost current scaling on gfx942 (the port refuses a recipe MI300X runs)",
        "_rocm.check_fp8_for_arch past its `not args.fp8` return, with --fp8-recipe tensorwise (v0.19)",
    ),
}


def _fail(message: str) -> int:
    print(f"inject_port_bug: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bug", nargs="?", choices=sorted(BUGS), help="the bug to inject (or to revert)")
    parser.add_argument("--tree", type=Path, help="the ported Megatron-LM tree (rocmport apply's work tree)")
    parser.add_argument("--revert", action="store_true", help="check the bug's file out of the tree's HEAD")
    parser.add_argument("--list", action="store_true", help="list the bugs, with where each lies")
    args = parser.parse_args(argv)
    if args.list:
        for name, bug in BUGS.items():
            print(f"{name}: {bug.path}: {bug.what}; {bug.where}")
        return 0
    if args.bug is None or args.tree is None:
        return _fail("give --tree TREE and a BUG (or --list)")
    bug = BUGS[args.bug]
    target = args.tree / bug.path
    if not target.is_file():
        return _fail(f"{target}: no such file; --tree must be a ported Megatron-LM tree")
    if args.revert:
        proc = subprocess.run(
            ["git", "checkout", "HEAD", "--", bug.path], cwd=args.tree, capture_output=True, text=True
        )
        if proc.returncode:
            return _fail(f"{target}: git checkout failed: {proc.stderr.strip()[:200]}")
        print(f"reverted {args.bug}: {target}")
        return 0
    text = target.read_text(encoding="utf-8")
    if text.count(bug.old) != 1:
        return _fail(
            f"{target}: the port's text for {args.bug} is there {text.count(bug.old)} times, not once "
            "(another line, or the bug already injected: --revert first)"
        )
    target.write_text(text.replace(bug.old, bug.new), encoding="utf-8")
    print(f"injected {args.bug}: {target}: {bug.what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
