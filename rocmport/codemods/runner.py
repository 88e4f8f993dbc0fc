"""Run codemods over a tree: one parse per file, one layer per codemod, files in parallel,
results cached by (file content, codemod names+versions+options). Each layer carries its
codemod's per-site reports (sites, skips with their reasons, warnings)."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import libcst as cst

from rocmport import output
from rocmport.codemods.base import Context, Report
from rocmport.codemods.catalog import registry
from rocmport.codemods.declared import recipe_helper_text
from rocmport.codemods.helper import helper_text  # noqa: F401 (tests and scripts import it from here)
from rocmport.config import default_cache_dir
from rocmport.fsutil import write_file
from rocmport.errors import BadInput
from rocmport.fsutil import UnsafePath, tree_kind, tree_read_text
from rocmport.procs import pool_map
from rocmport.upstreams import UPSTREAMS

# Bumped when what a cache entry holds changes shape (2: per-codemod reports).
CACHE_FORMAT = "2"
SKIP_DIRS = {".git", "__pycache__", ".venv", "node_modules", "build", "dist", ".tox"}
HELPER_PATHS = {u.helper_module: u.helper_path for u in UPSTREAMS.values()}


@dataclass
class Layer:
    name: str
    version: str
    files: dict[str, str] = field(default_factory=dict)
    sites: dict[str, int] = field(default_factory=dict)
    reports: dict[str, list[Report]] = field(default_factory=dict)  # path -> what the codemod decided there

    def all_reports(self) -> list[Report]:
        return [r for path in sorted(self.reports) for r in self.reports[path]]


@dataclass
class FileFailure:
    path: str
    line: int | None
    message: str


@dataclass
class LayersResult:
    layers: list[Layer]
    failures: list[FileFailure]
    files_total: int = 0
    files_parsed: int = 0
    cache_hits: int = 0

    def changed_files(self) -> set[str]:
        return {f for layer in self.layers for f in layer.files}


def _specs(codemods) -> list[dict]:
    out = []
    for entry in codemods:
        entry = {"name": entry, "options": {}} if isinstance(entry, str) else entry
        if entry["name"] not in registry:
            raise BadInput(f"unknown codemod '{entry['name']}'; known: {', '.join(sorted(registry))}")
        out.append(
            {"name": entry["name"], "options": entry.get("options") or {}, "version": registry[entry["name"]].VERSION}
        )
    return out


def python_files(tree: Path) -> list[str]:
    out = []
    for root, dirs, files in os.walk(tree):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        rel_root = Path(root).relative_to(tree)
        # A symlinked file is not a source file (its target, when inside the tree, is read on its own);
        # os.walk never descends into a linked directory.
        out += [
            str(rel_root / f) if str(rel_root) != "." else f
            for f in sorted(files)
            if f.endswith(".py") and not os.path.islink(os.path.join(root, f))
        ]
    return out


# What libcst's parser and its recursive visitors survive (Python's default recursion limit, ~3
# frames per level): 3,000 nested parentheses crash its native parser (a segfault, the worker pool
# with it), a 2,000-term `1+1+...` is 2,000 levels deep (a RecursionError, and minutes to parse). No
# upstream file comes near these (Megatron-LM's deepest: under 20 brackets, a few dozen chained
# operators); CPython itself refuses more than 200 nested brackets.
MAX_BRACKET_DEPTH = 100
MAX_CHAIN = 300  # binary/boolean/comparison operators and attribute dots in one expression at one level
MAX_FILE_BYTES = 4 * 1024 * 1024
FILE_SECONDS = 300  # one file's parse and codemods, at most (a worker process: never the whole run)

_CHAIN_OPS = {
    *"+ - * / // % ** @ << >> & | ^ < > <= >= == != .".split(),
}
_CHAIN_WORDS = {"and", "or", "in", "is", "not", "if", "else"}


def parse_limits(text: str) -> tuple[int | None, str] | None:
    """Why ``text`` is not handed to libcst ((line, reason)), or None: a check by Python's tokenizer
    (flat, linear, no recursion) for what would crash or exhaust the parser: too large, brackets
    nested too deeply, an operator chain too long."""
    import io
    import tokenize

    if len(text) > MAX_FILE_BYTES:
        return None, f"too large to parse ({len(text)} characters, over {MAX_FILE_BYTES})"
    depth = 0
    chains: list[int] = [0]
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.OP and tok.string in "([{":
                depth += 1
                chains.append(0)
                if depth > MAX_BRACKET_DEPTH:
                    return tok.start[0], f"brackets nested over {MAX_BRACKET_DEPTH} deep: not parsed"
            elif tok.type == tokenize.OP and tok.string in ")]}":
                depth = max(depth - 1, 0)
                if len(chains) > 1:
                    chains.pop()
            elif (tok.type == tokenize.OP and tok.string in _CHAIN_OPS) or (
                tok.type == tokenize.NAME and tok.string in _CHAIN_WORDS
            ):
                chains[-1] += 1
                if chains[-1] > MAX_CHAIN:
                    return tok.start[0], f"an expression chains over {MAX_CHAIN} operators: not parsed"
            elif tok.type in (tokenize.NEWLINE, tokenize.OP) and (tok.type == tokenize.NEWLINE or tok.string in ",;:="):
                chains[-1] = 0  # a new statement, element or argument starts a new chain
    except (tokenize.TokenError, SyntaxError, ValueError):
        # not Python (a bracket never closed, a bad indent), but within the limits: libcst, safe on
        # it now, says where and what, as it does for any syntax error
        return None
    return None


class _FileTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _FileTimeout


def transform_text(
    relpath: str, text: str, specs: list[dict], prefilter: bool = True
) -> tuple[dict[str, dict], FileFailure | None]:
    """Parse ``text`` once and run the codemods in order over the parsed module.

    {codemod name: {"code": text after it or None if unchanged, "sites": n, "reports": [...]}} for
    the codemods that changed the file or reported something about it. ``prefilter`` False runs
    every codemod in full (Context.prefilter): the differential tests compare the two. A file the
    parser cannot handle (parse_limits), one that exhausts it (RecursionError) or takes over
    FILE_SECONDS is a FileFailure naming it: the other files, and the pool, go on."""
    import signal
    import threading

    refused = parse_limits(text)
    if refused is not None:
        return {}, FileFailure(relpath, refused[0], refused[1])
    timed = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    if timed:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, FILE_SECONDS)
    try:
        return _transform(relpath, text, specs, prefilter)
    except _FileTimeout:
        return {}, FileFailure(relpath, None, f"not parsed and rewritten within {FILE_SECONDS} s")
    except (RecursionError, MemoryError) as exc:
        return {}, FileFailure(relpath, None, f"too deeply nested for the parser ({type(exc).__name__})")
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _transform(
    relpath: str, text: str, specs: list[dict], prefilter: bool
) -> tuple[dict[str, dict], FileFailure | None]:
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        return {}, FileFailure(relpath, exc.raw_line, str(exc).splitlines()[0])
    out: dict[str, dict] = {}
    prev = text
    # Metadata over an unchanged module is reused by the next codemod, and so is its text.
    shared: dict = {"code": (module, text)}
    for spec in specs:
        mod = registry[spec["name"]]
        if not mod.triggered(prev, spec["options"]):
            continue
        ctx = Context(
            relpath, spec["options"], codemod=spec["name"], shared=shared, facts=spec.get("facts"), prefilter=prefilter
        )
        try:
            new, sites = mod.transform(module, ctx)
        except Exception as exc:  # a codemod bug must not take the whole run down
            return out, FileFailure(relpath, None, f"{spec['name']}: {type(exc).__name__}: {exc}")
        # A codemod that returns the module it was given changed nothing: no codegen to find out.
        code = prev if new is module else ctx.code(new)
        changed = code != prev
        if changed or ctx.reports:
            out[spec["name"]] = {
                "code": code if changed else None,
                "sites": sites if changed else 0,
                "reports": [r.to_json() for r in ctx.reports],
            }
        if changed:
            module, prev = new, code
        shared["code"] = (module, prev)
    return out, None


def _work(args):
    relpath, text, specs = args
    return relpath, *transform_text(relpath, text, specs)


def _each_alone(work: list) -> list:
    """The files again, each in a worker of its own, after a worker died: a crash parse_limits did
    not foresee (libcst's native parser dies with a signal, not an exception). The file whose worker
    dies is a failure named with how it died; every other file is still rewritten."""
    done = []
    for item in work:
        try:
            done.extend(pool_map(_work, [item], 1))
        except BrokenProcessPool:
            done.append((item[0], {}, FileFailure(item[0], None, CRASHED)))
        output.advance(f"codemods: {len(done)}/{len(work)} files (each alone: a worker died)")
    return done


CRASHED = "the parser's process died on this file (a crash in libcst's native parser, not an exception): not parsed"


def _cache_key(relpath: str, text: str, specs_key: str) -> str:
    return hashlib.sha256(f"{CACHE_FORMAT}\0{relpath}\0{specs_key}\0".encode() + text.encode()).hexdigest()


def compute_layers(tree: Path, codemods, jobs: int | None = None, cache_dir: Path | None = None) -> LayersResult:
    tree = Path(tree)
    specs = _specs(codemods)
    result = LayersResult([Layer(s["name"], s["version"]) for s in specs], [])
    if not specs:
        return result
    specs_key = json.dumps(specs, sort_keys=True)
    if cache_dir is None:
        cache_dir = default_cache_dir()
    cache = Path(cache_dir) / "codemods"
    todo, outcomes = [], {}
    files = python_files(tree)
    result.files_total = len(files)
    texts: dict[str, str] = {}
    for rel in files:
        if rel in HELPER_PATHS.values():
            continue  # the generated helper is written by the runner, never rewritten by codemods
        try:
            texts[rel] = tree_read_text(tree, rel)
        except (UnicodeDecodeError, OSError, UnsafePath) as exc:
            result.failures.append(FileFailure(rel, None, f"unreadable: {exc}"))
    # What a codemod needs to know about the rest of the tree to rewrite one file (see
    # Codemod.tree_facts): given to that file only, and part of that file's cache key only.
    facts = [registry[s["name"]].tree_facts(texts, s["options"]) for s in specs]
    for rel, text in texts.items():
        if not any(registry[s["name"]].triggered(text, s["options"]) for s in specs):
            continue
        file_specs, key_specs = specs, specs_key
        if any(rel in f for f in facts):
            file_specs = [{**s, "facts": f[rel]} if rel in f else s for s, f in zip(specs, facts)]
            key_specs = json.dumps(file_specs, sort_keys=True)
        key = _cache_key(rel, text, key_specs)
        hit = cache / key[:2] / f"{key}.json"
        if hit.is_file():
            outcomes[rel] = json.loads(hit.read_text())
            result.cache_hits += 1
        else:
            todo.append((rel, text, file_specs, hit))
    result.files_parsed = len(todo)
    jobs = jobs or os.cpu_count() or 1
    work = [(rel, text, s) for rel, text, s, _ in todo]
    said = f"{result.cache_hits} from the cache, " if result.cache_hits else ""
    output.advance(f"codemods: 0/{len(work)} files ({said}{len(files)} in the tree)")
    if jobs > 1 and len(work) > 1:
        # A refresh hop re-runs a handful of files, one of them often 3,000 lines that takes most of
        # the time: the largest go first, one at a time, so that the workers finish together.
        order = sorted(range(len(work)), key=lambda i: -len(work[i][1]))
        # workers that end with apply/refresh: killed by kill -9 of it, and at once on a Ctrl-C
        try:
            ran = pool_map(
                _work,
                [work[i] for i in order],
                min(jobs, len(work)),
                each=lambda n: output.advance(f"codemods: {n}/{len(work)} files ({said}{len(files)} in the tree)"),
            )
        except BrokenProcessPool:
            ran = _each_alone([work[i] for i in order])
        by_index = dict(zip(order, ran))
        done = [by_index[i] for i in range(len(work))]
    else:
        done = []
        for w in work:
            done.append(_work(w))
            output.advance(f"codemods: {len(done)}/{len(work)} files ({said}{len(files)} in the tree)")
    output.advance(f"codemods: {len(done)}/{len(work)} files ({said}{len(files)} in the tree)", final=bool(work))
    for (rel, changes, failure), (_, _, _, hit) in zip(done, todo):
        if failure:
            result.failures.append(failure)
            continue
        outcomes[rel] = changes
        write_file(hit, json.dumps(changes))
    by_name = {layer.name: layer for layer in result.layers}
    for rel in sorted(outcomes):
        for name, outcome in outcomes[rel].items():
            if outcome["code"] is not None:
                by_name[name].files[rel] = outcome["code"]
                by_name[name].sites[rel] = outcome["sites"]
            if outcome["reports"]:
                by_name[name].reports[rel] = [Report.from_json(r) for r in outcome["reports"]]
    _add_helpers(tree, result, specs)
    return result


def _add_helpers(tree: Path, result: LayersResult, specs: list[dict]) -> None:
    """Write the runtime helper into the first layer whose rewritten sites import it."""
    text = recipe_helper_text(specs)
    for module, rel in HELPER_PATHS.items():
        if tree_kind(tree, str(PurePosixPath(rel).parent)) != "dir":
            continue
        for layer in result.layers:
            if registry[layer.name].USES_HELPER and any(Context(f).helper_module == module for f in layer.files):
                kind = tree_kind(tree, rel)
                if kind not in ("file", "missing"):  # never written or read through a link
                    raise UnsafePath(
                        f"{tree / rel}: the codemods' helper goes here, but it is {'a symlink' if kind == 'link' else 'not a file'}; "
                        f"rocmport never writes through a link (remove it from the patches or upstream)"
                    )
                current = tree_read_text(tree, rel) if kind == "file" else None
                if current != text:
                    layer.files[rel] = text
                    layer.sites[rel] = 0
                break
