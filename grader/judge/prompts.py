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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel, ConfigDict, ValidationError

from grader.errors import GraderError

Message = dict[str, str]

_ENV = ImmutableSandboxedEnvironment(
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)
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
    _rendered: dict[tuple[int, bool], str] = field(
        default_factory=dict, init=False, compare=False, hash=False, repr=False
    )


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
                raise PromptError(
                    f"{path}:{exc.lineno}: invalid JSON: {exc.msg} (column {exc.colno})"
                ) from exc
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
    return compile_prompt(
        spec.name or path.stem,
        path,
        hashlib.sha256(raw).hexdigest(),
        [(m.role, m.content) for m in spec.messages],
    )


def compile_prompt(
    name: str, path: Path, sha256: str, messages: list[tuple[str, str]], *, field: str = "messages"
) -> Prompt:
    """Compile ``(role, template)`` pairs into a :class:`Prompt`; errors name ``path``."""
    if not messages:
        raise PromptError(f"{path}: {field} is empty")
    templates = []
    for index, (_, content) in enumerate(messages):
        try:
            templates.append(_ENV.from_string(content))
        except jinja2.TemplateSyntaxError as exc:
            raise PromptError(
                f"{path}: {field}[{index}].content line {exc.lineno}: {exc.message}"
            ) from exc
    return Prompt(
        name=name,
        path=path,
        sha256=sha256,
        roles=tuple(_ROLE_ALIASES.get(role, role) for role, _ in messages),
        templates=tuple(templates),
        delimiters=frozenset(
            tag.lower() for _, content in messages for tag in _TAG.findall(content)
        ),
        static=tuple(_checklist_only(content) for _, content in messages),
    )


# What a template may hold and still render the same text for every row: literal text and
# {% if %} / {% if not %} on ``checklist``. Anything else (another variable, a filter such
# as |random, a call such as lipsum()) makes it a per-row template.
_STATIC_NODES = (nodes.Output, nodes.TemplateData, nodes.If, nodes.Not, nodes.Const)


def _checklist_only(source: str) -> bool:
    for node in _ENV.parse(source).find_all(nodes.Node):
        if isinstance(node, nodes.Name):
            if node.name != "checklist" or node.ctx != "load":
                return False
        elif type(node) not in _STATIC_NODES:
            return False
    return True


_TAG = re.compile(r"</?\s*([A-Za-z][\w.-]*)\s*>")


def neutralise_delimiters(text: str, tags: frozenset[str]) -> str:
    """Escape, inside row text, any tag the prompt uses as a delimiter.

    A model output containing ``</model_output>`` could otherwise close its block early and
    speak to the judge as if it were the prompt. The ``<`` of such a tag becomes ``&lt;``, so
    the judge still reads the text but no block boundary moves. Other ``<`` are left alone.
    """
    if not tags or "<" not in text:
        return text

    def escape(match: re.Match) -> str:
        return "&lt;" + match.group(0)[1:] if match.group(1).lower() in tags else match.group(0)

    return _OPEN_TAG.sub(escape, text)


# An opening or closing tag, complete or not: "</model_output" without ">" still misleads.
_OPEN_TAG = re.compile(r"<\s*/?\s*([A-Za-z][\w.-]*)")


class RenderError(ValueError):
    """A template that cannot be rendered for a row (a missing field, a sandbox violation)."""


def render_messages(prompt: Prompt, item: dict[str, Any], *, checklist: bool = True) -> list[Message]:
    """One row -> the chat messages sent to the judge (row text with delimiters neutralised)."""
    safe = {
        key: neutralise_delimiters(value, prompt.delimiters) if isinstance(value, str) else value
        for key, value in item.items()
    }
    context = {
        "item": safe,
        "sample": {"output_text": safe.get("output_text")},
        "checklist": checklist,
    }
    messages = []
    static = prompt.static if type(checklist) is bool else ()
    for index, (role, template) in enumerate(zip(prompt.roles, prompt.templates)):
        cached = index < len(static) and static[index]
        if cached and (index, checklist) in prompt._rendered:
            messages.append({"role": role, "content": prompt._rendered[index, checklist]})
            continue
        try:
            content = template.render(context)
        except jinja2.UndefinedError as exc:
            raise RenderError(f"prompt {prompt.name}: {exc.message}") from exc
        except jinja2.exceptions.SecurityError as exc:
            raise RenderError(f"prompt {prompt.name}: blocked by the sandbox: {exc}") from exc
        except Exception as exc:  # the template's own code failed: 1/0, "a" + 1, range(10**9)
            reason = " ".join(str(exc).splitlines())
            raise RenderError(
                f"prompt {prompt.name}: {role} message: {type(exc).__name__}: {reason}"
            ) from exc
        if cached:
            prompt._rendered[index, checklist] = content
        messages.append({"role": role, "content": content})
    return messages


def merge_system_into_user(messages: list[Message]) -> list[Message]:
    """For chat templates without a system role: system text leads the first user message."""
    system = [m["content"] for m in messages if m["role"] == "system"]
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if not system:
        return rest
    for message in rest:
        if message["role"] == "user":
            message["content"] = "\n\n".join([*system, message["content"]])
            return rest
    return [{"role": "user", "content": "\n\n".join(system)}, *rest]
