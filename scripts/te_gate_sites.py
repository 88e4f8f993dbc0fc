"""List every Transformer Engine version gate (`is_te_min_version(...)`) of a Megatron-LM release and
what the te-version-gates codemod does with it: the per-site review behind docs/te-version-gates.md.

    python scripts/te_gate_sites.py --mirror /path/to/Megatron-LM.git --ref core_v0.16.1 \
        --counts core_v0.15.3,core_v0.16.1,core_v0.17.1,core_v0.18.2,core_v0.19.0 > docs/te-version-gates.md

Sites the codemod rewrites are listed with the TE class and argument probed on HIP; every other
site is listed with the reason it keeps its numeric gate (first matching rule below)."""

from __future__ import annotations

import argparse
import re
import subprocess

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from rocmport.codemods.te_version_gates import GATE, ClassGates, KwargGates

# (pattern over the file path and the gated statement's source, reason it stays numeric)
LEFT_RULES = [
    (r"megatron/legacy/", "legacy model flags (megatron.legacy, gone at v0.18): version bookkeeping"),
    (r"extra_state|_extra_state|state\[\"recipe\"\]|fp8_meta\[", "checkpoint extra-state format of a TE version: bookkeeping, must match the checkpoint"),
    (r"ub_|tp_comm_overlap|userbuffer|UserBuffer", "userbuffers comm overlap: NVIDIA-only (NVLink userbuffers); ROCm runs without it"),
    (r"cuda_graphs\.py|make_graphed_callables|graph", "TE CUDA-graph capture API (make_graphed_callables arguments and FP8 state saving): several arguments and internals at once, kept"),
    (r"offload", "activation CPU offloading internals: TE-version-specific API, no single argument to probe"),
    (r"fp4|FP4|NVFP4|nvfp4|MXFP8|mxfp8", "FP4/MXFP8 recipes: NVIDIA Blackwell formats; where ROCm TE lacks them its recipe constructors fail loudly, so the numeric gate stays"),
    (r"fp8|FP8|Float8|recipe|quantiz|Quantized", "FP8 recipe / quantized-tensor API: ROCm TE implements a subset under NVIDIA's module layout; numeric gate kept"),
    (r"^\s*(from|import) |\bimport\b", "import of a module that moved between TE versions: ROCm TE keeps the layout of the release it tracks"),
    (r"arguments\.py|transformer_config\.py|optimizer_config\.py", "argument validation: the user-facing requirement message, checked before any TE call"),
    (r"rng|checkpoint\(", "activation-checkpoint / RNG-tracker API shape of TE: not one argument; kept"),
    (r"rope|rotary", "fused RoPE entry point that moved between TE versions: kept"),
    (r".", "behaviour switch by TE version (not a single keyword argument of a TE class): kept"),
]


def sites(path: str, source: str) -> list[dict]:
    wrapper = MetadataWrapper(cst.parse_module(source))
    pos, parents = wrapper.resolve(PositionProvider), wrapper.resolve(ParentNodeProvider)
    kwargs, classes = KwargGates(), ClassGates()
    wrapper.module.visit(kwargs)
    wrapper.module.visit(classes)
    changed = {id(node): (owner, kwarg) for node, owner, kwarg in kwargs.changed + classes.changed}
    out = []

    class Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call):
            if not (isinstance(node.func, cst.Name) and node.func.value == GATE and node.args):
                return
            stmt = node
            while not isinstance(stmt, (cst.If, cst.SimpleStatementLine, cst.Module)):
                stmt = parents[stmt]
            version = node.args[0].value.evaluated_value if isinstance(node.args[0].value, cst.SimpleString) else "?"
            text = wrapper.module.code_for_node(stmt)
            probe = changed.get(id(stmt))
            if probe:
                what = (f"probe on HIP: does `transformer_engine.{probe[0]}` take `{probe[1]}`?" if probe[1]
                        else f"probe on HIP: does `transformer_engine.{probe[0]}` exist?")
                kind = "changed"
            else:
                kind, what = "left", next(why for pat, why in LEFT_RULES if re.search(pat, path + "\n" + text[:600]))
            out.append({"path": path, "line": pos[node].start.line, "version": version, "kind": kind, "what": what})

    wrapper.visit(Calls())
    return out


def tree_sites(mirror: str, ref: str) -> list[dict]:
    files = subprocess.run(["git", "grep", "-l", f"{GATE}(", ref, "--", "megatron"], cwd=mirror, capture_output=True, text=True).stdout.split()
    found = []
    for entry in files:
        path = entry.split(":", 1)[1]
        source = subprocess.run(["git", "show", entry], cwd=mirror, capture_output=True, text=True, check=True).stdout
        if f"def {GATE}" in source and source.count(f"{GATE}(") == 1:
            continue  # the definition itself
        found += [s for s in sites(path, source) if not source.splitlines()[s["line"] - 1].lstrip().startswith("def ")]
    return sorted(found, key=lambda s: (s["path"], s["line"]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mirror", required=True)
    p.add_argument("--ref", default="core_v0.16.1")
    p.add_argument("--counts", default="", help="comma-separated refs to count sites for")
    args = p.parse_args()
    rows = tree_sites(args.mirror, args.ref)
    print("# Transformer Engine version gates: the per-site review\n")
    print("Generated by `python scripts/te_gate_sites.py` (see its docstring); the codemod is "
          "`te-version-gates` (rocmport/codemods/te_version_gates.py). Changed sites keep their version answer on "
          "CUDA and ask ROCm TE's API on HIP; the others keep their numeric gate for the reason given.\n")
    if args.counts:
        print("| release | sites | changed (probe on HIP) | left |\n|---|---|---|---|")
        for ref in args.counts.split(","):
            r = tree_sites(args.mirror, ref)
            changed = sum(s["kind"] == "changed" for s in r)
            print(f"| {ref} | {len(r)} | {changed} | {len(r) - changed} |")
        print()
    print(f"## Sites at {args.ref}\n\n| site | gate | | what / why |\n|---|---|---|---|")
    for s in rows:
        print(f"| `{s['path']}:{s['line']}` | `{s['version']}` | {s['kind']} | {s['what']} |")


if __name__ == "__main__":
    main()
