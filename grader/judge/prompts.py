"""Judge prompts: the sandboxed Jinja2 environment, prompt files, item -> chat messages.

A prompt file (YAML or JSON) is ``{"messages": [{"role", "content"}, ...]}``, the shape of the
``input`` of an OpenAI ``score_model`` grader. Each content is a Jinja2 template over ``item``
(the dataset row), ``sample`` (``sample.output_text``, for OpenAI-style graders) and
``checklist``. Dataset text is only ever a template *variable*: it is never compiled, so
``{{ }}`` inside a row is printed as written.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel, ConfigDict, ValidationError

from grader.errors import GraderError
from grader.io.dataset import unsendable

Message = dict[str, str]

# Bounds on rendering one row: the sandbox caps each range() at 100,000 items, but two
# nested loops over such ranges run 10**10 steps, and "x" * 10**10 or 10 ** 10 ** 10 stall
# or fill the memory; a prompt file must fail on its first row with one line instead.
MAX_LOOP_STEPS = 1_000_000  # iterations of all {% for %} loops of one row's messages
MAX_RENDER_SECONDS = 10.0
MIN_RENDER_CHARS = 16 * 2**20  # a row's messages may hold 4x its own text, and at least this
MAX_POWER_BITS = 1_000_000  # the largest integer ** may build


class _OverBudget(SecurityError):
    """A row's render went past one of the bounds above."""


class _RenderBudget(threading.local):
    steps = 0
    deadline = float("inf")
    chars = MIN_RENDER_CHARS


_BUDGET = _RenderBudget()


def _out_of_time() -> None:
    if time.monotonic() > _BUDGET.deadline:
        raise _OverBudget(f"rendering one row took more than {MAX_RENDER_SECONDS:g} s")


def _counted_loop(iterable: Any) -> Any:
    """Every {% for %} iterates through this (see _BoundedEnvironment._parse)."""
    budget = _BUDGET
    for value in iterable:
        budget.steps += 1
        if budget.steps > MAX_LOOP_STEPS:
            raise _OverBudget(f"the template's loops ran more than {MAX_LOOP_STEPS:,} steps "
                                "for one row (nested loops?)")
        _out_of_time()
        yield value


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every loop counted, the clock checked on each call, and ``*`` and
    ``**`` refused where their result would be huge."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.globals["_grader_loop"] = _counted_loop

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(nodes.Name("_grader_loop", "load", lineno=loop.lineno),
                                   [loop.iter], [], None, None, lineno=loop.lineno)
        return tree

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _out_of_time()
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _out_of_time()
        if operator == "**" and type(left) is int and type(right) is int:
            if right > 0 and abs(left) > 1 and abs(left).bit_length() * right > MAX_POWER_BITS:
                raise _OverBudget(f"{left} ** {right} is too large a number")
        elif operator == "*":
            for sequence, times in ((left, right), (right, left)):
                if isinstance(sequence, (str, list, tuple)) and type(times) is int:
                    if len(sequence) * times > _BUDGET.chars:
                        raise _OverBudget(f"a sequence repeated {times} times is too long")
        return super().call_binop(context, operator, left, right)


def _bounded_width(filter_function: Any, name: str) -> Any:
    """``center`` and ``indent``: a width of 10**9 builds a gigabyte before any check."""

    def bounded(value: Any, width: Any = 80, *args: Any, **kwargs: Any) -> Any:
        if type(width) is int and width > _BUDGET.chars:
            raise _OverBudget(f"{name}({width}) is too wide")
        return filter_function(value, width, *args, **kwargs)

    return bounded


def _as_json(value: Any) -> Any:
    """What ``{{ value }}`` prints: a row's non-string values as JSON writes them (true, null,
    ["a", 1]), not as Python's str() would (True, None, ['a', 1]); the judge reads JSON."""
    if value is None or isinstance(value, (bool, dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return value


_ENV = _BoundedEnvironment(finalize=_as_json, undefined=jinja2.StrictUndefined, trim_blocks=True,
                           lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
for _name in ("center", "indent"):
    _ENV.filters[_name] = _bounded_width(_ENV.filters[_name], _name)
_ROLE_ALIASES = {"developer": "system"}  # the seed's "Developer:" is the system role


class PromptError(GraderError, ValueError):
    """A prompt file that cannot be used; the message names the file (and line)."""


class _MessageSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str
    type: Literal["message"] | None = None  # OpenAI's EasyInputMessage carries it


class _PromptSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    description: str | None = None
    messages: list[_MessageSpec]


@dataclass(frozen=True)
class Prompt:
    """A loaded, compiled judge prompt."""

    name: str
    path: Path
    sha256: str
    roles: tuple[str, ...]
    templates: tuple[jinja2.Template, ...]
    # Tag names the prompt itself uses to delimit data (<reference>, <model_output>, ...).
    delimiters: frozenset[str] = frozenset()
    # Per template: True when its text depends on nothing but ``checklist`` (the seed's
    # system message), so render_messages renders it once per checklist value.
    static: tuple[bool, ...] = ()
    # The (role, template text) pairs it was compiled from.
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)
    # Where every template is plain (_plain): the (variable, field) each prints, and the
    # length of all its literal text; None: a row's render can fail in other ways.
    plain: tuple[tuple[str, str], ...] | None = field(default=None, compare=False, repr=False)
    literal_chars: int = field(default=0, compare=False, repr=False)
    _rendered: dict[tuple[int, bool], str] = field(default_factory=dict, init=False,
                                                   compare=False, hash=False, repr=False)

    def __reduce__(self) -> tuple[Any, ...]:
        # Compiled jinja2 templates do not pickle (nor do this environment's filters): a judge
        # sent to a worker process or a Ray actor compiles the same texts again there.
        return compile_prompt, (self.name, self.path, self.sha256, list(self.sources))


def _prompt_dirs() -> list[Path]:
    package = Path(__file__).resolve().parent.parent  # grader/
    # a wheel carries the prompts inside the package; an editable install reads the repo's
    return [package / "prompts", package.parent / "prompts"]


def builtin_prompts() -> dict[str, Path]:
    """Prompt names shipped with grader -> their files."""
    found: dict[str, Path] = {}
    for folder in reversed(_prompt_dirs()):
        if folder.is_dir():
            found.update({p.stem: p for p in sorted(folder.glob("*.yaml"))})
    return found


def resolve_prompt_path(name_or_path: str) -> Path:
    """A built-in prompt name (``seed``) or a path to a prompt file."""
    path = Path(name_or_path)
    if path.suffix in {".yaml", ".yml", ".json"} or path.exists():
        if not path.is_file():
            raise PromptError(f"{path}: prompt file not found")
        return path
    builtin = builtin_prompts()
    if name_or_path not in builtin:
        names = ", ".join(sorted(builtin)) or "none"
        raise PromptError(f"unknown prompt {name_or_path!r}: built-in prompts are {names}")
    return builtin[name_or_path]


def load_prompt(name_or_path: str = "seed") -> Prompt:
    """Read, validate and compile a prompt file."""
    path = resolve_prompt_path(name_or_path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
        if path.suffix == ".json":
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise PromptError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg} "
                                  f"(column {exc.colno})") from exc
            except (ValueError, RecursionError):  # a 5000-digit number, nesting too deep
                raise PromptError(f"{path}: invalid JSON: a number too long or nesting too deep") from None
        else:
            import yaml  # only needed for YAML prompt files

            data = yaml.safe_load(text)
    except PromptError:
        raise
    except (UnicodeDecodeError, ValueError) as exc:
        raise PromptError(f"{path}: cannot be read: {exc}".splitlines()[0]) from exc
    except Exception as exc:  # yaml.YAMLError carries the line in its message
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise PromptError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from exc
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise PromptError(f"{path}: expected a mapping with a 'messages' list, got {got}")
    try:
        spec = _PromptSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        where = f"{path}: {loc}" if loc else str(path)
        raise PromptError(f"{where}: {first['msg']}") from exc
    return compile_prompt(spec.name or path.stem, path, hashlib.sha256(raw).hexdigest(),
                          [(m.role, m.content) for m in spec.messages])


def compile_prompt(name: str, path: Path, sha256: str, messages: list[tuple[str, str]], *,
                   field: str = "messages") -> Prompt:
    """Compile ``(role, template)`` pairs into a :class:`Prompt`; errors name ``path``."""
    if not messages:
        raise PromptError(f"{path}: {field} is empty")
    templates = []
    for index, (_, content) in enumerate(messages):
        try:
            templates.append(_ENV.from_string(content))
        except jinja2.TemplateSyntaxError as exc:
            raise PromptError(f"{path}: {field}[{index}].content line {exc.lineno}: "
                              f"{exc.message}") from exc
    static, plain, literal_chars = _analysed([content for _, content in messages])
    delimiters = frozenset(tag.lower() for _, content in messages for tag in _TAG.findall(content))
    return Prompt(name=name, path=path, sha256=sha256,
                  roles=tuple(_ROLE_ALIASES.get(role, role) for role, _ in messages),
                  templates=tuple(templates), delimiters=delimiters, sources=tuple(messages),
                  static=static, plain=plain, literal_chars=literal_chars)


def _analysed(sources: list[str]) -> tuple[tuple[bool, ...], tuple[tuple[str, str], ...] | None, int]:
    """:class:`Prompt`'s ``static``, ``plain`` and ``literal_chars`` of its templates."""
    each = [_plain(source) for source in sources]
    return (tuple(one is not None and not one[0] for one in each),
            None if None in each else tuple(f for one in each if one for f in one[0]),
            sum(one[1] for one in each if one))


# What a plain template holds: literal text, {% if %} / {% if not %} on ``checklist``, and
# ``item.NAME`` or ``sample.output_text`` printed as they are. Rendering one cannot fail once
# those fields hold text (:func:`renders`); one that prints no field renders the same text for
# every row. Anything else (a filter such as |random, a call such as lipsum()) may do either.
_PLAIN_NODES = (nodes.Output, nodes.TemplateData, nodes.If, nodes.Not, nodes.Const, nodes.Name,
                nodes.Getattr)
_PLAIN_VARIABLES = ("checklist", "item", "sample")


def _plain(source: str) -> tuple[tuple[tuple[str, str], ...], int] | None:
    """The (variable, field) pairs a plain template prints and the length of its literal
    text; None where it is not plain."""
    printed: list[tuple[str, str]] = []
    literal = names = 0  # names: item and sample, each the object of a field printed
    for node in _ENV.parse(source).find_all(nodes.Node):
        if type(node) not in _PLAIN_NODES:
            return None
        if isinstance(node, nodes.Name):
            if node.name not in _PLAIN_VARIABLES or node.ctx != "load":
                return None
            names += node.name != "checklist"
        elif isinstance(node, nodes.Getattr):
            field = _field(node)
            if field is None:
                return None
            printed.append(field)
            names -= 1
        elif isinstance(node, (nodes.TemplateData, nodes.Const)):
            text = node.data if isinstance(node, nodes.TemplateData) else node.value
            text = text if isinstance(text, str) else repr(text)  # JSON: no longer than repr
            if unsendable(text):
                return None
            literal += len(text)
    return None if names else (tuple(printed), literal)


def _field(node: nodes.Getattr) -> tuple[str, str] | None:
    """``item.NAME`` or ``sample.output_text`` as (variable, field); None for anything else,
    such as a dict's own attribute (``item.items`` is not the row's field of that name)."""
    variable = node.node.name if isinstance(node.node, nodes.Name) else None
    if variable == "item" and not hasattr(dict, node.attr) or (
            variable == "sample" and node.attr == "output_text"):
        return variable, node.attr
    return None


def renders(prompt: Prompt, fields: Mapping[str, Any]) -> bool:
    """Whether :func:`render_messages` renders ``fields`` without an error, known without
    rendering: the prompt is plain (:attr:`Prompt.plain`), every field it prints is text, and
    the whole stays within the row's size bound. False: only a render can tell. The fields'
    own text is the caller's to have checked (:func:`unsendable`)."""
    if prompt.plain is None:
        return False
    size = prompt.literal_chars
    for variable, name in prompt.plain:
        value = fields.get("output_text" if variable == "sample" else name)
        if type(value) is not str:
            return False
        size += 4 * len(value)  # a neutralised delimiter's "<" becomes "&lt;"
    return size <= _render_chars(fields)


def _render_chars(fields: Mapping[str, Any]) -> int:
    """How long a row's rendered text may grow: four times its own text, at least MIN_RENDER_CHARS."""
    return max(MIN_RENDER_CHARS, 4 * sum(len(v) for v in fields.values() if isinstance(v, str)))


_TAG = re.compile(r"</?\s*([A-Za-z][\w.-]*)\s*>")


def neutralise_delimiters(text: str, tags: frozenset[str]) -> str:
    """Escape, inside row text, any tag the prompt uses as a delimiter.

    A model output containing ``</model_output>`` could otherwise close its block early and
    speak to the judge as if it were the prompt. The ``<`` of such a tag becomes ``&lt;``, so
    the judge still reads the text but no block boundary moves. Other ``<`` are left alone.
    """
    if not tags or "<" not in text:
        return text

    def escape(match: re.Match[str]) -> str:
        return "&lt;" + match.group(0)[1:] if match.group(1).lower() in tags else match.group(0)

    return _OPEN_TAG.sub(escape, text)


# An opening or closing tag, complete or not: "</model_output" without ">" still misleads.
_OPEN_TAG = re.compile(r"<\s*/?\s*([A-Za-z][\w.-]*)")


class RenderError(ValueError):
    """A template that cannot be rendered for a row (a missing field, a sandbox violation)."""


def render_messages(prompt: Prompt, item: Mapping[str, Any], *, checklist: bool = True) -> list[Message]:
    """One row -> the chat messages sent to the judge (row text with delimiters neutralised)."""
    safe = {key: neutralise_delimiters(value, prompt.delimiters) if isinstance(value, str)
            else value for key, value in item.items()}
    context = {"item": safe, "sample": {"output_text": safe.get("output_text")},
               "checklist": checklist}
    messages = []
    _BUDGET.steps, _BUDGET.deadline = 0, time.monotonic() + MAX_RENDER_SECONDS
    _BUDGET.chars = _render_chars(item)
    static = prompt.static if type(checklist) is bool else ()
    for index, (role, template) in enumerate(zip(prompt.roles, prompt.templates, strict=True)):
        cached = index < len(static) and static[index]
        if cached and (index, checklist) in prompt._rendered:
            messages.append({"role": role, "content": prompt._rendered[index, checklist]})
            continue
        content = _render_or_refuse(prompt, role, template, context)
        problem = unsendable(content)
        if problem:  # the row's own text was checked before (invalid_input): the template's
            raise RenderError(f"prompt {prompt.name} ({prompt.path}): {role} message: the "
                              f"template printed {problem}, which no engine can take")
        if cached:
            prompt._rendered[index, checklist] = content
        messages.append({"role": role, "content": content})
    return messages


def _render_or_refuse(prompt: Prompt, role: str, template: jinja2.Template,
                      context: Mapping[str, object]) -> str:
    """One message rendered, or a :class:`RenderError` that names the prompt and why."""
    try:
        return _render(template, context)
    except jinja2.UndefinedError as exc:
        raise RenderError(f"prompt {prompt.name}: {exc.message}") from exc
    except _OverBudget as exc:  # before SecurityError, its base
        raise RenderError(f"prompt {prompt.name} ({prompt.path}): {role} message: {exc}") from exc
    except jinja2.exceptions.SecurityError as exc:
        raise RenderError(f"prompt {prompt.name}: blocked by the sandbox: {exc}") from exc
    except Exception as exc:  # the template's own code failed: 1/0, "a" + 1, range(10**9)
        reason = " ".join(str(exc).splitlines())
        raise RenderError(f"prompt {prompt.name}: {role} message: {type(exc).__name__}: "
                          f"{reason}") from exc

def _render(template: jinja2.Template, context: Mapping[str, object]) -> str:
    """``template.render(context)``, stopped once the text outgrows the row's budget."""
    chunks, size = [], 0
    for chunk in template.generate(context):
        size += len(chunk)
        if size > _BUDGET.chars:
            raise _OverBudget(f"the rendered text passed {_BUDGET.chars:,} characters for one row")
        chunks.append(chunk)
        _out_of_time()
    return "".join(chunks)

