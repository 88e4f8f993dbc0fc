"""Generate docs/rocm-port-coverage.md: every item a ROCm port of Megatron-LM has to handle (the port
catalogue, issue 17's run-time gaps, and what else AMD's projects fix), per release line, with what
AMD's fork and Primus do and what rocmport does.

What can be generated is: the recipe of each line (patchsets/megatron-lm/<line>/series: its
patches and codemods) and the sites each codemod rewrites at each line's release (its own site
reports, docs/coverage/sites.json). The rest (what upstream and AMD's projects do) is
docs/coverage/items.yaml, written by hand from the sources it names.

    python scripts/port_coverage.py                 # write docs/rocm-port-coverage.md
    python scripts/port_coverage.py --check         # exit 1 when the committed document is stale
    python scripts/port_coverage.py --mirror /path/to/Megatron-LM.git [--cache DIR]
                                                    # recompute sites.json first (ports every line's
                                                    # release: minutes per line without a warm cache)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rocmport.codemods import compute_layers, registry  # noqa: E402
from rocmport.patches.series import load_series  # noqa: E402

ITEMS = REPO / "docs" / "coverage" / "items.yaml"
SITES = REPO / "docs" / "coverage" / "sites.json"
DOC = REPO / "docs" / "rocm-port-coverage.md"
# The release each line's sites are counted at (the newest final tag of the line).
RELEASES = {
    "v0.15": "core_v0.15.3",
    "v0.16": "core_v0.16.1",
    "v0.17": "core_v0.17.1",
    "v0.18": "core_v0.18.2",
    "v0.19": "core_v0.19.0",
}


def recipes() -> dict[str, object]:
    return {line: load_series(REPO / "patchsets" / "megatron-lm" / line / "series") for line in RELEASES}


def codemod_names(series) -> list[str]:
    return [c if isinstance(c, str) else c["name"] for c in series.codemods]


def port_sites(mirror: str, line: str, series, cache: Path | None = None) -> dict[str, list[list]]:
    """Port the line's release (its patches, then its codemods) and keep every site report. ``cache``:
    the codemods' result cache (by file content and codemod version) to reuse between runs."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", mirror, "archive", RELEASES[line]], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        for patch in series.patches:
            subprocess.run(["git", "apply", "-"], input=patch.diff, text=True, cwd=tree, check=True)
        result = compute_layers(tree, series.codemods, cache_dir=cache or Path(tmp) / "cache")
    if result.failures:
        raise SystemExit(f"{line}: codemod failures: {result.failures}")
    return {
        layer.name: [[r.path, r.line, r.message] for r in layer.all_reports() if r.kind == "site"]
        for layer in result.layers
    }


def matches(mechanism: dict, site: list) -> bool:
    return (
        re.search(mechanism.get("message", ""), site[2]) is not None
        and re.search(mechanism.get("path", ""), site[0]) is not None
    )


def line_cell(item: dict, line: str, series, sites: dict) -> tuple[str, list[str]]:
    """What rocmport does for ``item`` at ``line`` (a short cell) and the sites behind it."""
    parts, where = [], []
    names = codemod_names(series)
    patches = [p.name for p in series.patches]
    for mech in item.get("rocmport_by", []):
        if "lines" in mech and line not in mech["lines"]:  # a mechanism for some lines only (e.g. a backport)
            continue
        if "codemod" in mech:
            if mech["codemod"] not in names:
                parts.append(f"`{mech['codemod']}` not in the recipe")
                continue
            found = [s for s in sites.get(line, {}).get(mech["codemod"], []) if matches(mech, s)]
            where += [f"`{s[0]}:{s[1]}`" for s in found]
            parts.append(f"`{mech['codemod']}` {len(found)}" if found else f"`{mech['codemod']}`: no site")
        elif "patch" in mech:
            hit = next((p for p in patches if p.startswith(mech["patch"])), None)
            parts.append(f"patch {mech['patch']}" if hit else f"patch {mech['patch']} not in the recipe")
        else:
            parts.append(mech["other"])
    return "; ".join(parts), where


def status(item: dict, cells: dict[str, str]) -> str:
    if item.get("open"):
        return "open"
    if any("not in the recipe" in c for c in cells.values()):
        return "partial"
    return "covered"


def render(items: list[dict], sites: dict, series_by_line: dict) -> str:
    lines = list(RELEASES)
    out = [
        "# ROCm port coverage: what a Megatron-LM port to ROCm has to handle, per release line",
        "",
        "GENERATED by `python scripts/port_coverage.py` from the recipes (`patchsets/megatron-lm/<line>/series`),",
        "the codemods' own site reports at each line's release (`docs/coverage/sites.json`, recomputed with",
        "`--mirror`) and `docs/coverage/items.yaml` (what upstream, AMD's fork ROCm/Megatron-LM and AMD's Primus do,",
        "with their sources). Do not edit; a test fails when this file is stale.",
        "",
        "A cell names the codemod (with its rewritten sites at that release), the patch, or the other part",
        'of rocmport that handles the item; "no site" means the release has nothing to rewrite there.',
        "",
        "| item | " + " | ".join(f"{ln} ({RELEASES[ln]})" for ln in lines) + " | status |",
        "|---|" + "---|" * (len(lines) + 1),
    ]
    details = []
    for item in items:
        cells, wheres = {}, {}
        for ln in lines:
            cells[ln], wheres[ln] = line_cell(item, ln, series_by_line[ln], sites)
        st = status(item, cells)
        out.append(
            f"| [{item['id']}](#{item['id'].lower()}) {item['title']} | "
            + " | ".join(cells[ln] or "—" for ln in lines)
            + f" | {st} |"
        )
        details += [f"### {item['id']}", "", f"**{item['title']}** ({st})", ""]
        for key, label in (
            ("upstream", "Upstream"),
            ("amd_fork", "AMD's fork (ROCm/Megatron-LM)"),
            ("primus", "AMD's Primus"),
            ("rocmport", "rocmport"),
            ("open", "Open, and why"),
        ):
            if item.get(key):
                details.append(f"- {label}: {item[key].strip()}")
        site_lines = [f"  - {ln}: {', '.join(wheres[ln])}" for ln in lines if wheres[ln]]
        if site_lines:
            details += ["- Rewritten sites per line (from the codemods' reports):", *site_lines]
        details.append("")
    out += [
        "",
        "Status: covered (every line where the site exists), partial (a line's recipe lacks the codemod),",
        "open (not handled; the reason is given).",
        "",
        "## Items",
        "",
        *details,
    ]
    counts = ["## Codemod sites per line", "", "| codemod | " + " | ".join(lines) + " |", "|---|" + "---|" * len(lines)]
    used = sorted({n for ln in lines for n in codemod_names(series_by_line[ln])}, key=list(registry).index)
    for name in used:
        counts.append(
            f"| `{name}` | "
            + " | ".join(
                str(len(sites.get(ln, {}).get(name, []))) if name in codemod_names(series_by_line[ln]) else "—"
                for ln in lines
            )
            + " |"
        )
    out += counts + [""]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--mirror", help="a Megatron-LM git mirror: recompute docs/coverage/sites.json from each line's release"
    )
    p.add_argument("--cache", type=Path, help="with --mirror: keep the codemods' result cache here (reruns are quick)")
    p.add_argument(
        "--check", action="store_true", help="exit 1 when docs/rocm-port-coverage.md is stale; write nothing"
    )
    args = p.parse_args()
    series_by_line = recipes()
    if args.mirror:
        sites = {}
        for line, series in series_by_line.items():
            print(f"porting {RELEASES[line]} ...", file=sys.stderr, flush=True)
            sites[line] = port_sites(args.mirror, line, series, args.cache)
        SITES.write_text(json.dumps(sites, indent=1, sort_keys=True) + "\n")
    items = yaml.safe_load(ITEMS.read_text())
    text = render(items, json.loads(SITES.read_text()), series_by_line)
    if args.check:
        if not DOC.is_file() or DOC.read_text() != text:
            print(
                f"{DOC.relative_to(REPO) if DOC.is_relative_to(REPO) else DOC} is stale: run python scripts/port_coverage.py",
                file=sys.stderr,
            )
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
