"""The code-layout page, written from the tree each time the manual is built (a MkDocs hook).

docs/code-layout.md holds the prose and a marker; at build time the marker becomes the layering rule
(read from tests/test_architecture.py's PIPELINE, the order that test enforces) and one table per
package of rocmport/ listing each module with the first sentence of its docstring, packages in
pipeline order, subpackages under their parent. So the page lists what the tree holds, whatever is
moved or added: a hand-kept table drifted. A package without a docstring is a build warning (an
error under `mkdocs build --strict`). `python docs/hooks/code_layout.py` prints the generated part.
"""

from __future__ import annotations

import ast
import logging
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PAGE = "code-layout.md"
MARKER = "<!-- code-layout: generated from the tree at build time -->"
# A module's row keeps its docstring's first sentence up to this many characters (a table cell).
MAX_SUMMARY = 240

log = logging.getLogger("mkdocs.hooks.code_layout")


def pipeline(repo: Path) -> list[str]:
    """The package order tests/test_architecture.py enforces ("" for the top-level modules)."""
    source = repo / "tests" / "test_architecture.py"
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PIPELINE" for t in node.targets):
            return [str(x) for x in ast.literal_eval(node.value)]
    raise ValueError(f"{source}: no PIPELINE list to read the layering order from")


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), str(path))) or ""


def first_paragraph(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


def first_sentence(doc: str) -> str:
    """Up to the first full stop that ends a sentence (followed by a capital or a code span)."""
    paragraph = first_paragraph(doc)
    match = re.search(r"(?<=[.!?])\s+(?=[A-Z`(])", paragraph)
    sentence = paragraph[: match.start()] if match else paragraph
    if len(sentence) > MAX_SUMMARY:
        sentence = sentence[:MAX_SUMMARY].rsplit(" ", 1)[0] + " …"
    return sentence


def inline(text: str) -> str:
    """Docstring text as Markdown inside a table cell: code spans kept (``x`` as `x`), and outside
    them the characters Markdown would read as markup (a `<ref>` as an HTML tag, `*`, `_`, `|`)."""
    parts = re.split(r"(``.+?``|`[^`]+`)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append("`" + part.strip("`").replace("|", "\\|") + "`")
        else:
            out.append(re.sub(r"([\\*_\[\]|])", r"\\\1", part).replace("<", "&lt;").replace(">", "&gt;"))
    return "".join(out)


def packages(package_root: Path) -> list[Path]:
    return sorted(p.parent for p in package_root.rglob("__init__.py"))


def module_table(directory: Path) -> list[str]:
    modules = sorted(p for p in directory.glob("*.py") if p.name != "__init__.py")
    if not modules:
        return ["All of it in `__init__.py`."]
    rows = ["| module | what it is |", "| --- | --- |"]
    for path in modules:
        summary = first_sentence(docstring(path))
        rows.append(f"| `{path.stem}` | {inline(summary) if summary else '—'} |")
    return rows


def render(repo: Path = REPO, warn: Any = None) -> str:
    """The generated Markdown. ``warn(message)`` is called for each package without a docstring."""
    package_root = repo / "rocmport"
    order = pipeline(repo)
    top = [p for p in packages(package_root) if p.parent == package_root]

    def rank(path: Path) -> tuple[int, str]:
        name = path.name
        return (order.index(name) if name in order else len(order), name)

    layers = [p for p in order if p and (package_root / p).is_dir()]
    lines = [
        "## The layering rule",
        "",
        "Checked by `tests/test_architecture.py` (its `PIPELINE`, read here): a package imports only from",
        "itself, the top-level modules and the packages before it in the order "
        + ", ".join(f"`{p}`" for p in layers)
        + "; nothing outside `rocmport/commands/` imports the command layer or `cli.py`; and there is no",
        "import cycle (imports inside functions count).",
        "",
        "## Top-level modules",
        "",
        inline(first_paragraph(docstring(package_root / "__init__.py"))),
        "",
        *module_table(package_root),
    ]

    def section(directory: Path, depth: int) -> None:
        doc = first_paragraph(docstring(directory / "__init__.py"))
        relative = directory.relative_to(repo).as_posix()
        if not doc and warn is not None:
            warn(f"{relative}/__init__.py has no docstring: say what the package holds (the code-layout page shows it)")
        lines.extend(["", f"{'#' * depth} `{relative}/`", ""])
        if doc:
            lines.extend([inline(doc), ""])
        lines.extend(module_table(directory))
        for child in sorted(p for p in packages(directory) if p.parent == directory):
            section(child, min(depth + 1, 6))

    for package in sorted(top, key=rank):
        section(package, 2)
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: the marker of docs/code-layout.md becomes the generated layout."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        log.warning(f"docs/{PAGE}: the marker {MARKER} is gone; the generated layout has nowhere to go")
        return markdown
    return markdown.replace(MARKER, render(REPO, warn=log.warning))


if __name__ == "__main__":
    sys.stdout.write(render(REPO, warn=lambda message: print(f"warning: {message}", file=sys.stderr)))
