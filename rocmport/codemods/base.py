"""What a codemod is: a name, a version, a one-line purpose, cheap trigger tokens, and a
transform over a parsed libcst Module that returns the new Module and its changed-site count.

A codemod also reports what it decided per site through its Context: ``site`` (a rewritten site,
with a note), ``skip`` (a candidate left alone, and why) and ``warning`` (something a person should
check). The runner caches the reports with the text and `rocmport codemod --json` lists them;
scripts/te_gate_sites.py builds docs/te-version-gates.md from te-version-gates' reports.

Matching is by what a name means, not how it is spelled: `qualified_names` resolves a node through
the module's imports (libcst's scope analysis, as its QualifiedNameProvider), so `import torch.cuda.amp as amp;
amp.custom_fwd` and `from torch.cuda.amp import custom_fwd` are both `torch.cuda.amp.custom_fwd`."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Literal

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import MetadataWrapper, PositionProvider, ScopeProvider
from libcst.metadata.position_provider import NEWLINE_RE

from rocmport.upstreams import upstream_of_path

ReportKind = Literal["site", "skip", "warning"]


@dataclass(frozen=True)
class Report:
    """One decision a codemod took at one place: rewrote it (site), left it (skip), or flags it."""

    codemod: str
    path: str
    line: int | None
    kind: ReportKind
    message: str
    detail: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Report":
        return cls(**data)


@dataclass
class Context:
    """What a codemod knows about the file it transforms, and where it reports its decisions.

    Report lines are 1-based lines of the text the codemod was given (upstream's own lines when it
    runs first or alone, as scripts/te_gate_sites.py runs te-version-gates)."""

    relpath: str
    options: dict = field(default_factory=dict)
    codemod: str = ""
    reports: list[Report] = field(default_factory=list)
    # Shared by the codemods of one file: metadata resolved over a module that a codemod left
    # unchanged is reused by the next one (the runner keeps the unchanged module object).
    shared: dict = field(default_factory=dict)
    # What the codemod's `tree_facts` found about this file in the rest of the tree (None: nothing).
    facts: object = None
    # Skip the work that cannot change the output (a text or structure shows there is nothing to
    # rewrite, a transformer kept out of subtrees that cannot hold a site): off only in the
    # differential tests, which hold the output to the full run's byte for byte.
    prefilter: bool = True

    def code(self, module: cst.Module) -> str:
        """``module.code``, without generating it again for the module the runner parsed (or a
        module a codemod left unchanged): a codegen of a 3,000-line file costs ~0.2 s of CPU."""
        known = self.shared.get("code")
        if known is not None and known[0] is module:
            return known[1]
        text = module.code
        self.shared["code"] = (module, text)
        return text

    def absent(self, module: cst.Module, *tokens: str) -> bool:
        """True when the prefilter is on and none of ``tokens`` is in the module's text: the caller
        then skips work that can only act where one of them is spelled."""
        if not self.prefilter:
            return False
        text = self.code(module)
        return not any(t in text for t in tokens)

    def wrap(self, module: cst.Module) -> MetadataWrapper:
        """Metadata over ``module`` (qualified names, positions), computed once per module state."""
        cached = self.shared.get("wrapper")
        if cached is None or cached.module is not module:
            cached = self.shared["wrapper"] = wrap(module)
        return cached

    @property
    def helper_module(self) -> str:
        """The generated runtime helper rewritten sites import (megatron-core ships only megatron.core)."""
        return upstream_of_path(self.relpath).helper_module

    def start_lines(self, module: cst.Module, nodes: Iterable[cst.CSTNode]) -> dict[cst.CSTNode, int]:
        """The start line PositionProvider gives each of ``nodes`` (of ``module``). With the
        prefilter on, from a codegen that only notes where each node starts (start_lines): a fifth
        of the provider's CPU (0.09 against 0.41 s over arguments.py), the lines the same."""
        nodes = list(nodes)
        if self.prefilter:
            return start_lines(module, nodes)
        lines = self.wrap(module).resolve(PositionProvider)
        return {node: lines[node].start.line for node in nodes}

    def sites_at(self, module: cst.Module, found: list[tuple[cst.CSTNode, str]]) -> None:
        """Report rewritten sites given as (node of ``module``, message); positions are computed
        only when there is something to report."""
        if found:
            lines = self.start_lines(module, [node for node, _ in found])
            for node, message in found:
                self.site(message, lines[node])

    def _add(self, kind: ReportKind, message: str, line: int | None, detail: dict) -> None:
        self.reports.append(Report(self.codemod, self.relpath, line, kind, message, detail))

    def site(self, message: str, line: int | None = None, **detail) -> None:
        """A site this codemod rewrote, with what it does there."""
        self._add("site", message, line, detail)

    def skip(self, reason: str, line: int | None = None, **detail) -> None:
        """A candidate site this codemod deliberately leaves alone, and why."""
        self._add("skip", reason, line, detail)

    def warn(self, message: str, line: int | None = None, **detail) -> None:
        """Something at this site a person should check (the rewrite could not decide it)."""
        self._add("warning", message, line, detail)


class Codemod:
    NAME: str = ""
    DESCRIPTION: str = ""
    TRIGGERS: tuple[str, ...] = ()
    # From rocmport/codemods/declared.py, the one place they are written (read there without libcst):
    VERSION: str = "1"
    USES_HELPER: bool = False  # rewritten call sites import megatron/core/_rocm.py (written by the runner when needed)
    OPTIONS: dict = {}  # the options a series may give it: name -> spec (see codemods/options.py)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not cls.NAME:
            return
        from rocmport.codemods.declared import DECLARED

        spelled = [a for a in ("VERSION", "USES_HELPER", "OPTIONS") if a in cls.__dict__]
        if spelled or cls.NAME not in DECLARED:
            raise TypeError(
                f"codemod {cls.NAME}: declare its version, helper use and options in rocmport/codemods/declared.py "
                f"(not on the class: {', '.join(spelled) or 'no entry there'})"
            )
        d = DECLARED[cls.NAME]
        cls.VERSION, cls.USES_HELPER, cls.OPTIONS = d.version, d.uses_helper, d.options

    def triggers(self, options: dict) -> tuple[str, ...]:
        """Cheap text tokens: a file containing none of them is never parsed."""
        return self.TRIGGERS

    def triggered(self, text: str, options: dict | None = None) -> bool:
        # Tokens starting with "\n" match at the start of a line (the file's first line too).
        text = "\n" + text
        return any(t in text for t in self.triggers(options or {}))

    def tree_facts(self, texts: Mapping[str, str], options: dict) -> dict[str, object]:
        """What rewriting a file needs to know from the other files of its tree: relpath -> a
        JSON-able fact, given to that file's transform as `ctx.facts` and keyed into that file's
        cache entry. Most codemods need nothing (the default)."""
        return {}

    def transform(self, module: cst.Module, ctx: Context) -> tuple[cst.Module, int]:
        raise NotImplementedError


@dataclass
class _Starts(CodegenState):
    """Codegen that notes, for every node, how many tokens precede the point PositionProvider
    starts it at: its syntactic start where the node records one (from ``start_node`` when given),
    else where its code begins; the provider's own rules, without its line and column per token."""

    starts: dict[cst.CSTNode, int] = field(default_factory=dict)
    stack: list[int] = field(default_factory=list)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self.stack.append(len(self.tokens))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self.stack.pop()
        if node not in self.starts:  # a syntactic start, recorded inside, stands
            self.starts[node] = start

    def pop_trailing_newline(self) -> None:
        pass  # the tokens stay as counted

    @contextmanager
    def record_syntactic_position(
        self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None, end_node: cst.CSTNode | None = None
    ) -> Iterator[None]:
        start = len(self.tokens)
        try:
            yield
        finally:
            self.starts[node] = self.starts[start_node] if start_node is not None else start


def start_lines(module: cst.Module, nodes: list[cst.CSTNode]) -> dict[cst.CSTNode, int]:
    """PositionProvider's start line of each of ``nodes`` (of ``module``), from one codegen of
    ``module`` and the line breaks before each node counted as the provider counts them (per token)."""
    state = _Starts(default_indent=module.default_indent, default_newline=module.default_newline)
    module._codegen(state)
    at_token = {node: state.starts[node] for node in nodes}  # KeyError, as the provider's, for a stranger
    lines: dict[int, int] = {}
    line, done = 1, 0
    for k in sorted(set(at_token.values())):
        for token in state.tokens[done:k]:
            if "\n" in token or "\r" in token:
                line += len(NEWLINE_RE.findall(token))
        lines[k], done = line, k
    return {node: lines[k] for node, k in at_token.items()}


def wrap(module: cst.Module) -> MetadataWrapper:
    """Metadata (qualified names, positions, parents) over ``module`` as it is: no copy, no re-parse."""
    return MetadataWrapper(module, unsafe_skip_copy=True)


# The metadata a codemod that matches names by meaning declares (its METADATA_DEPENDENCIES).
NAMES = (ScopeProvider,)


def qualified_names(visitor: cst.MetadataDependent, node: cst.CSTNode) -> set[str]:
    """What ``node`` names after following the module's imports and aliases: libcst's
    QualifiedNameProvider answer, asked of the scope only for the nodes a codemod looks at. The
    provider walks the whole module to file, for every node, this same lazy question of the same
    scope (a fifth of a codemod's time on a large file); the visitor declares NAMES instead."""
    scope = visitor.get_metadata(ScopeProvider, node, None)
    return {q.name for q in scope.get_qualified_names_for(node)} if scope else set()


def means(visitor: cst.MetadataDependent, node: cst.CSTNode, *names: str) -> str | None:
    """The first of ``names`` that ``node`` resolves to (exactly, or as `<module>.<name>` when the
    name is given with a leading dot), else None."""
    found = qualified_names(visitor, node)
    for name in names:
        if name.startswith("."):
            if any(q == name[1:] or q.endswith(name) for q in found):
                return name
        elif name in found:
            return name
    return None


def _leads_into(prefix: str, names: tuple[str, ...]) -> bool:
    return any(n == prefix or n.startswith(prefix + ".") for n in names)


def binds_by_target(node: ast.AST, name: str) -> bool:
    """Whether ``node`` binds ``name`` other than by an import, an assignment's Name or a def: as a
    parameter, `except ... as`, `global`/`nonlocal`, or a match pattern's capture."""
    if isinstance(node, (ast.arg, ast.ExceptHandler, ast.Global, ast.Nonlocal, ast.MatchAs, ast.MatchStar)):
        return name in (getattr(node, "names", None) or [getattr(node, "arg", None) or getattr(node, "name", None)])
    return isinstance(node, ast.MatchMapping) and node.rest == name


def spelled_plainly(text: str, names: tuple[str, ...]) -> bool:
    """True when ``text`` settles which nodes mean ``names`` (dotted names of one package, as
    `torch.cuda.empty_cache`): the package's name is bound only by module-level `import <package>`
    (at least once; `import <package>.<module>` too), by nothing else anywhere (no alias,
    assignment, parameter, import in a function or class), no
    other import binds a name that leads into ``names`` (`from torch import cuda`, `import
    torch.cuda as c`), and there is no star import. A node then means one of ``names`` exactly when
    it spells it (``dotted``), as scope analysis answers; a whole-module scope analysis costs
    ~0.7 s of CPU over arguments.py, Python's parser and a walk of its tree a fraction of it."""
    package = names[0].split(".")[0]
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # what libcst parses and ast does not
        return False
    bound = False
    todo: list[tuple[ast.AST, bool]] = [(stmt, True) for stmt in tree.body]  # (node, in the module's own scope)
    while todo:
        node, top = todo.pop()
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname is None and a.name.split(".")[0] == package:
                    # `import torch.distributed` binds torch too (what it spells, it means); one in
                    # a function binds it in that function's scope: left to the scope analysis.
                    if not top:
                        return False
                    bound = bound or a.name == package
                elif (a.asname or a.name.split(".")[0]) == package or (a.asname and _leads_into(a.name, names)):
                    return False
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                source = f"{node.module or ''}.{a.name}".lstrip(".")
                if a.name == "*" or (a.asname or a.name) == package or _leads_into(source, names):
                    return False
        elif isinstance(node, ast.Name) and node.id == package and not isinstance(node.ctx, ast.Load):
            return False
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == package:
            return False
        elif binds_by_target(node, package):
            return False
        inner = top and not isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.comprehension)
        )
        todo += [(child, inner) for child in ast.iter_child_nodes(node)]
    return bound


def means_as_spelled(visitor: cst.MetadataDependent, plain: bool, node: cst.CSTNode, *names: str) -> str | None:
    """``means``, or where the text settled what names mean (``spelled_plainly``), the name ``node`` spells."""
    if not plain:
        return means(visitor, node, *names)
    spelled = dotted(node) if isinstance(node, cst.BaseExpression) else None
    return spelled if spelled in names else None


def dotted(node: cst.BaseExpression | None) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None (spelling only: for exception names and imports)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr.value}" if head else None
    return None


def import_names(stmt: cst.Import | cst.ImportFrom) -> list[str]:
    """Top-level module names an import statement imports (`from a.b import c` -> ['a.b'])."""
    if isinstance(stmt, cst.Import):
        return [dotted(a.name) or "" for a in stmt.names]
    if stmt.relative:
        return []
    return [dotted(stmt.module) or ""]


def bound_names(stmt: cst.Import | cst.ImportFrom) -> list[str]:
    """The names an import statement binds in the module namespace."""
    out = []
    if isinstance(stmt, cst.Import):
        for a in stmt.names:
            out.append(
                cst.ensure_type(a.asname.name, cst.Name).value if a.asname else (dotted(a.name) or "").split(".")[0]
            )
    elif not isinstance(stmt.names, cst.ImportStar):
        for a in stmt.names:
            out.append(cst.ensure_type(a.asname.name, cst.Name).value if a.asname else dotted(a.name) or "")
    return out
