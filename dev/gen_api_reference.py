"""Generate docs/api.md, the API reference, from the docstrings of everything public.

    python dev/gen_api_reference.py            # rewrite docs/api.md
    python dev/gen_api_reference.py --check    # exit 1, saying what is wrong, when docs/api.md is stale or a
                                               # public docstring breaks the convention below

"Public" is `deepgemm.__all__`, `deepgemm.nn.__all__` and `deepgemm.distributed.__all__`: a name added to one of
them is picked up (sorted into a section by `section_of`); tests/cpu/test_api_reference.py runs `--check`'s rules.

The docstring convention (what `problems` enforces, what `render` understands):

- A summary line, then free text. Headings stand alone at the docstring's left margin, from `HEADINGS`:
  `Args:`, `Returns:`, `Raises:`, `Raised by:`, `Returned by:`, `Fields:`, `Note:`, `Example::` (the `::` makes
  the indented block under it a literal code block). A heading's content is indented; a line back at the margin
  ends it (free text again).
- `Args:` has one item per parameter, `name: text` (or `a = (A e4m3 [M, K], ...): text` for a pair, or
  `include / exclude: text` for several), continuation lines indented; for GEMMs the items of `a` and `b` give the
  operand layouts (shape, dtype, which dimension is contiguous).
- Functions and classes users construct have `Args:` (every parameter), `Raises:` and `Example::`; exceptions have
  `Raised by:` and `Example::`; result records (dataclasses) have `Returned by:` and `Example::`.
- Examples are never run (they need a Hopper GPU) but must parse, and every call of a deepgemm function in them must
  bind to its real signature.
- In free text, a paragraph with hanging-indent lines is a list of items; a paragraph ending in `::` introduces a
  literal block. Markdown is not otherwise interpreted: `*`, a leading `_` and `<tag` are escaped.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import re
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET = ROOT / "docs" / "api.md"
COMMAND = "python dev/gen_api_reference.py"
MODULES = ("deepgemm", "deepgemm.nn", "deepgemm.distributed")

# Sections, in page order, with the order of the names known today; names not listed follow alphabetically.
SECTIONS: dict[str, tuple[str, ...]] = {
    "Dense GEMM": ("fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt", "bf16_gemm_nt", "bf16_gemm_nn",
                   "bf16_gemm_tn", "bf16_gemm_tt", "precompile_fp8_gemm_nt"),
    "M-grouped GEMM (MoE)": ("get_m_alignment_for_contiguous_layout", "m_grouped_fp8_gemm_nt_contiguous",
                             "m_grouped_fp8_gemm_nt_contiguous_psum", "m_grouped_fp8_gemm_nt_masked",
                             "check_grouped_layout"),
    "K-grouped GEMM (MoE weight gradient)": ("k_grouped_fp8_gemm_tn_contiguous",),
    "Quantization": ("quantize_per_token_group", "quantize_per_block", "dequantize_per_token_group",
                     "dequantize_per_block"),
    "Layout helpers": ("to_mn_major_tma_aligned",),
    "FP8 training": ("fp8_linear", "Fp8TrainingLinear"),
    "Fused softmax and RoPE": ("softmax", "rope", "rope_"),
    "PyTorch modules (deepgemm.nn)": ("Fp8Linear", "convert", "ConversionReport", "load_fp8_checkpoint",
                                      "save_fp8_checkpoint", "LoadReport", "precompile_model", "PrecompileSummary"),
    "Tensor parallelism (deepgemm.distributed)": ("ColumnParallelFp8Linear", "RowParallelFp8Linear",
                                                  "shard_fp8_checkpoint", "shard_bounds", "chunk_bounds"),
    "Errors": ("DeepGemmError", "CompileError", "CacheError", "LockTimeoutError", "GraphCaptureError",
               "UnsupportedError", "NotDifferentiableError", "GroupedLayoutError"),
    "Utilities": ("backend_for", "supported", "set_pdl", "get_pdl", "calc_diff"),
}
GEMM_SECTIONS = ("Dense GEMM", "M-grouped GEMM (MoE)", "K-grouped GEMM (MoE weight gradient)")

HEADINGS = ("Args", "Returns", "Raises", "Raised by", "Returned by", "Fields", "Note", "Example", "Examples")
ITEM_SECTIONS = ("Args", "Raises", "Raised by", "Fields")
_HEADING = re.compile(r"^(%s)(::?)\s*$" % "|".join(re.escape(h) for h in HEADINGS))
# nn.Module protocol methods: the class docstring says what a call does.
SKIPPED_MEMBERS = ("forward", "extra_repr")
WIDTH = 100


# ------------------------------------------------------------------------------------------- what is public


@dataclass
class Entry:
    """One documented object: its name (the first public path), the other public paths, its section."""

    name: str
    obj: Any
    section: str
    aliases: list[str] = field(default_factory=list)

    @property
    def short(self) -> str:
        return self.name.rsplit(".", 1)[1]


def is_exception(obj: Any) -> bool:
    return inspect.isclass(obj) and issubclass(obj, BaseException)


def is_record(obj: Any) -> bool:
    """A result record: a dataclass the API returns (users read it, never build it)."""
    return inspect.isclass(obj) and dataclasses.is_dataclass(obj) and not is_exception(obj)


def section_of(name: str, obj: Any, exported_by: Iterable[str]) -> str:
    """Where a public name goes: the section listing it, else by the subpackage exporting it, else by kind and
    name."""
    modules = set(exported_by)
    for section, names in SECTIONS.items():  # a name listed in a section goes there
        if name in names:
            return section
    if "deepgemm.distributed" in modules:
        return "Tensor parallelism (deepgemm.distributed)"
    if "deepgemm.nn" in modules:
        return "PyTorch modules (deepgemm.nn)"
    if is_exception(obj):
        return "Errors"
    if name.startswith("k_grouped_"):
        return "K-grouped GEMM (MoE weight gradient)"
    if name.startswith("m_grouped_") or "grouped_layout" in name or name.endswith("_contiguous_layout"):
        return "M-grouped GEMM (MoE)"
    if re.search(r"(^|_)gemm(_|$)", name):
        return "Dense GEMM"
    if "quantize" in name:
        return "Quantization"
    if "tma_aligned" in name or "layout" in name:
        return "Layout helpers"
    return "Utilities"


def public_entries() -> list[Entry]:
    """Every public object once, in page order."""
    found: dict[int, tuple[list[str], Any]] = {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            paths, _ = found.setdefault(id(obj), ([], obj))
            paths.append(f"{module_name}.{name}")
    entries = []
    for paths, obj in found.values():
        short = paths[0].rsplit(".", 1)[1]
        section = section_of(short, obj, (p.rsplit(".", 1)[0] for p in paths))
        entries.append(Entry(paths[0], obj, section, paths[1:]))

    def key(entry: Entry) -> tuple[int, int, str]:
        order = SECTIONS[entry.section]
        known = order.index(entry.short) if entry.short in order else len(order)
        return list(SECTIONS).index(entry.section), known, entry.short

    return sorted(entries, key=key)


def members(cls: type) -> list[tuple[str, Any]]:
    """Public methods a class adds: defined on it or on a private base of ours, not on a documented class."""
    out: dict[str, Any] = {}
    for klass in cls.__mro__:
        if klass is not cls and (not klass.__module__.startswith("deepgemm") or not klass.__name__.startswith("_")):
            break
        for name, value in vars(klass).items():
            if name.startswith("_") or name in SKIPPED_MEMBERS or name in out:
                continue
            if isinstance(value, (staticmethod, classmethod)) or inspect.isfunction(value) or isinstance(value, property):
                out[name] = getattr(cls, name) if not isinstance(value, property) else value
    return sorted(out.items())


# ------------------------------------------------------------------------------------------- signatures


def _annotation(annotation: Any, scope: dict[str, Any] | None = None) -> str:
    """An annotation as written (string annotations stay strings), a private alias of `scope` spelled out."""
    if annotation is inspect.Parameter.empty:
        return ""
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)

    def expand(match: re.Match[str]) -> str:
        alias = (scope or {}).get(match.group(0))
        return match.group(0) if alias is None or isinstance(alias, type) else repr(alias)

    return re.sub(r"(?<![\w.])_[A-Za-z]\w*", expand, text)


def _default(value: Any) -> str:
    text = repr(value)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)  # never a memory address


def signature_text(name: str, obj: Any) -> str:
    """`name(params) -> return`, one parameter per line when it is wider than the page."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    scope = getattr(inspect.unwrap(obj.__init__ if inspect.isclass(obj) else obj), "__globals__", {})
    parameters = list(sig.parameters.values())
    if "." in name and parameters and parameters[0].name == "self":
        parameters = parameters[1:]  # a method, shown as called on an instance
    params: list[str] = []
    previous: inspect._ParameterKind | None = None
    for p in parameters:
        if previous is p.POSITIONAL_ONLY and p.kind is not p.POSITIONAL_ONLY:
            params.append("/")
        if p.kind is p.KEYWORD_ONLY and previous not in (p.KEYWORD_ONLY, p.VAR_POSITIONAL):
            params.append("*")
        stars = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        text = stars + p.name
        annotation = _annotation(p.annotation, scope)
        if annotation:
            text += f": {annotation}"
        if p.default is not p.empty:
            text += f" = {_default(p.default)}" if annotation else f"={_default(p.default)}"
        params.append(text)
        previous = p.kind
    returns = _annotation(sig.return_annotation, scope)
    tail = f" -> {returns}" if returns and not inspect.isclass(obj) else ""
    one_line = f"{name}({', '.join(params)}){tail}"
    if len(one_line) <= WIDTH:
        return one_line
    return f"{name}(\n" + "".join(f"    {p},\n" for p in params) + f"){tail}"


# ------------------------------------------------------------------------------------------- docstrings


@dataclass
class Section:
    title: str | None  # None: the text before the first heading
    lines: list[str]
    literal: bool  # the heading ended in '::': its block is code


def own_doc(obj: Any) -> str | None:
    """The object's own docstring (a class's, not inherited; not the one dataclasses make up)."""
    if inspect.isclass(obj):
        doc = vars(obj).get("__doc__")
        if doc and dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
            return None
        return doc
    if isinstance(obj, property):
        return obj.__doc__
    return getattr(obj, "__doc__", None)


def sections(doc: str) -> list[Section]:
    parts = [Section(None, [], False)]
    for line in inspect.cleandoc(doc).splitlines():
        match = _HEADING.match(line)
        if match:
            parts.append(Section(match.group(1), [], match.group(2) == "::"))
        elif parts[-1].title is not None and line.strip() and _indent(line) == 0:
            parts.append(Section(None, [line], False))  # back at the margin: the section ended
        else:
            parts[-1].lines.append(line)
    for part in parts:
        part.lines = textwrap.dedent("\n".join(part.lines)).strip("\n").splitlines()
    return parts


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def items(lines: list[str]) -> list[str]:
    """Hanging-indent items: a line at the block's left margin starts one, deeper lines continue it."""
    nonblank = [line for line in lines if line.strip()]
    if not nonblank:
        return []
    margin = min(_indent(line) for line in nonblank)
    out: list[str] = []
    for line in nonblank:
        if _indent(line) == margin or not out:
            out.append(line.strip())
        else:
            out[-1] += " " + line.strip()
    return out


def item_names(item: str) -> list[str]:
    """The parameter names an Args item documents: `x: ...`, `a = (...): ...`, `include / exclude: ...`."""
    head = re.split(r": | = |:$", item, maxsplit=1)[0]
    return [n.strip().lstrip("*").strip("`") for n in re.split(r"[/,]", head) if n.strip()]


# ------------------------------------------------------------------------------------------- Markdown


def inline(text: str) -> str:
    """Docstring text as Markdown: code spans kept (``x`` becomes `x`), `*`, a leading `_` and a `<` that could open
    an HTML tag escaped."""
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        part = parts[i].replace("\\", "\\\\").replace("*", "\\*")
        part = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", part)  # what could open an HTML tag
        parts[i] = re.sub(r"(?<![\w\\])_", r"\\_", part)
    return "".join(parts)


def _item_markdown(item: str) -> str:
    match = re.match(r"^([^:`]{1,100}?): (.*)$", item)
    key = match.group(1) if match else ""
    if match and ". " not in key and (" " not in key or any(c in key for c in "=/,(")):  # a name, not prose
        return f"- `{match.group(1)}`: {inline(match.group(2))}"
    return f"- {inline(item)}"


def fence(lines: list[str], language: str) -> list[str]:
    return [f"```{language}", *textwrap.dedent("\n".join(lines)).strip("\n").splitlines(), "```"]


def text_markdown(lines: list[str]) -> list[str]:
    """Free text: paragraphs, hanging-indent item lists, `::` literal blocks."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        paragraph = []
        margin = _indent(lines[i])
        while i < len(lines) and lines[i].strip():
            paragraph.append(lines[i])
            i += 1
        literal = paragraph[-1].rstrip().endswith("::")
        if literal:
            paragraph[-1] = paragraph[-1].rstrip()[:-1]
        if any(_indent(line) > margin for line in paragraph[1:]):
            out += [_item_markdown(item) for item in items(paragraph)]
        else:
            out.append(inline(" ".join(line.strip() for line in paragraph)))
        out.append("")
        if literal:
            block = []
            while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > margin):
                block.append(lines[i])
                i += 1
            out += fence(block, "text") + [""]
    return out


def doc_markdown(doc: str) -> list[str]:
    out: list[str] = []
    for part in sections(doc):
        if part.title is not None:
            out += [f"**{part.title}**", ""]
        if part.literal:
            out += fence(part.lines, "python" if part.title in ("Example", "Examples") else "text") + [""]
        elif part.title in ITEM_SECTIONS:
            out += [_item_markdown(item) for item in items(part.lines)] + [""]
        else:
            out += text_markdown(part.lines)
    return out


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def entry_markdown(entry: Entry) -> list[str]:
    obj = entry.obj
    kind = "exception" if is_exception(obj) else "class" if inspect.isclass(obj) else "function"
    out = [f"### `{entry.name}`", ""]
    if is_exception(obj):
        bases = ", ".join(b.__name__ for b in obj.__bases__)
        out += ["```python", f"class {entry.short}({bases})", "```", ""]
    elif is_record(obj):
        fields = "".join(f"    {f.name}: {_annotation(f.type)}\n" for f in dataclasses.fields(obj))
        out += ["```python", f"@dataclass\nclass {entry.short}:\n{fields.rstrip()}", "```", ""]
    else:
        prefix = "class " if kind == "class" else ""
        out += ["```python", prefix + signature_text(entry.short, obj), "```", ""]
    if entry.aliases:
        out += ["Also " + ", ".join(f"`{alias}`" for alias in entry.aliases) + ".", ""]
    doc = own_doc(obj)
    out += doc_markdown(doc) if doc else ["(no docstring)", ""]
    if inspect.isclass(obj) and not is_exception(obj) and not is_record(obj):
        for name, member in members(obj):
            title = f"{entry.short}.{name}"
            target = member.fget if isinstance(member, property) else member
            shown = title if isinstance(member, property) else signature_text(title, target)
            out += [f"#### `{title}`", "", "```python", shown, "```", ""]
            member_doc = own_doc(member)
            out += doc_markdown(member_doc) if member_doc else ["(no docstring)", ""]
    return out


INTRO = f"""\
# API reference

Generated from the docstrings by `{COMMAND}`: edit the docstrings, not this page
(`tests/cpu/test_api_reference.py` fails when the two differ). Everything here is importable from `deepgemm`,
`deepgemm.nn` or `deepgemm.distributed` as named.

Conventions: A and B are FP8 (`torch.float8_e4m3fn`) with float32 scales, passed as `(tensor, scales)` pairs;
`nt` means A is `[M, K]` and B is given as `[N, K]` (both K-major), so D = A·Bᵀ. The examples need a Hopper GPU
(`device="cuda"`); on CPU tensors the same calls run the reference path after the same argument checks, so the
`Raises` lists hold on every path. Argument errors name the argument and the rule.
"""


def render() -> str:
    entries = public_entries()
    by_section: dict[str, list[Entry]] = {}
    for entry in entries:
        by_section.setdefault(entry.section, []).append(entry)
    out = [INTRO, "## Contents", ""]
    for title, group in by_section.items():
        names = ", ".join(f"[`{e.short}`](#{anchor(f'`{e.name}`')})" for e in group)
        out.append(f"- **[{title}](#{anchor(title)})**: {names}")
    out.append("")
    for title, group in by_section.items():
        out += [f"## {title}", ""]
        for entry in group:
            out += entry_markdown(entry)
    return "\n".join(out).rstrip("\n") + "\n"


# ------------------------------------------------------------------------------------------- the rules


def _parameters(obj: Any) -> list[str]:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    return [p.name for p in sig.parameters.values() if p.name not in ("self", "cls")]


def _resolve(node: ast.expr, names: dict[str, Any]) -> Any:
    """The object an expression like `deepgemm.nn.Fp8Linear.from_linear` names, or None (a local value)."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, names)
        if base is None:
            return None
        if not hasattr(base, node.attr):
            if isinstance(base, ModuleType) or inspect.isclass(base):
                raise AttributeError(f"{ast.unparse(node)} does not exist")
            return None
        return getattr(base, node.attr)
    return None


def example_problems(code: str, where: str, mentions: str) -> list[str]:
    """The code must parse, mention `mentions`, and call deepgemm's functions with arguments their signatures bind."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return [f"{where}: the example does not parse: {exc}"]
    problems = []
    if not re.search(rf"\b{re.escape(mentions)}\b", code):
        problems.append(f"{where}: the example never uses {mentions}")
    names: dict[str, Any] = {"deepgemm": importlib.import_module("deepgemm"), "torch": importlib.import_module("torch")}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root in ("deepgemm", "torch"):
                    module = importlib.import_module(alias.name)
                    names[alias.asname or root] = module if alias.asname else importlib.import_module(root)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("deepgemm", "torch"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    problems.append(f"{where}: the example imports {node.module}.{alias.name}, which does not exist")
                else:
                    names[alias.asname or alias.name] = getattr(module, alias.name)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        try:
            target = _resolve(node.func, names)
        except AttributeError as exc:
            problems.append(f"{where}: the example uses {exc}")
            continue
        if target is None or not getattr(target, "__module__", "").startswith("deepgemm"):
            continue
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue
        try:
            inspect.signature(target).bind(*node.args, **{k.arg: k.value for k in node.keywords if k.arg})
        except TypeError as exc:
            problems.append(f"{where}: the example's call {ast.unparse(node)[:80]} does not fit the signature: {exc}")
    return problems


def entry_problems(entry: Entry) -> list[str]:
    obj, where = entry.obj, entry.name
    doc = own_doc(obj)
    if not doc or not doc.strip():
        return [f"{where}: no docstring"]
    parts = {part.title: part for part in sections(doc)}
    problems = []
    if is_exception(obj):
        required: tuple[str, ...] = ("Raised by", "Example")
    elif is_record(obj):
        required = ("Returned by", "Example")
    else:
        target = obj.__init__ if inspect.isclass(obj) else obj
        required = ("Args", "Raises", "Example") if _parameters(target) else ("Raises", "Example")
    for title in required:
        if title not in parts and not (title == "Example" and "Examples" in parts):
            problems.append(f"{where}: no '{title}:' section")
    example = parts.get("Example") or parts.get("Examples")
    if example is not None:
        if not example.literal:
            problems.append(f"{where}: write 'Example::' (a literal code block)")
        problems += example_problems("\n".join(example.lines), where, entry.short)
    if "Args" in required and "Args" in parts:
        documented = {name for item in items(parts["Args"].lines) for name in item_names(item)}
        for name in _parameters(target):
            if name not in documented:
                problems.append(f"{where}: argument '{name}' has no item in 'Args:'")
        if entry.section in GEMM_SECTIONS and "gemm" in entry.short and not entry.short.startswith("precompile"):
            for item in items(parts["Args"].lines):
                if set(item_names(item)) & {"a", "b"} and not re.search(r"\[[^\]]+\]", item):
                    problems.append(f"{where}: the 'Args:' item of {item_names(item)} gives no layout ([shape])")
    if inspect.isclass(obj) and not is_exception(obj) and not is_record(obj):
        for name, member in members(obj):
            if not own_doc(member):
                problems.append(f"{where}.{name}: no docstring")
    return problems


def problems() -> list[str]:
    """Every break of the docstring convention over the public API."""
    return [problem for entry in public_entries() for problem in entry_problems(entry)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when docs/api.md is stale or a docstring is wrong")
    parser.add_argument("--output", type=Path, default=TARGET, help="where to write (default docs/api.md)")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        found = problems()
        for problem in found:
            print(problem)
        stale = not args.output.exists() or args.output.read_text() != text
        if stale:
            print(f"{args.output} is out of date with the docstrings; regenerate it: {COMMAND}")
        return 1 if stale or found else 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
