"""MkDocs hooks: the documentation pages generated from the code at build time.

- ``operator/settings.md``: every setting of ``ffdl.server.settings.Settings``, its type,
  default, environment variable and the comment the source gives it;
- ``reference/http-api.md`` (and ``reference/openapi.json``): the live app's OpenAPI
  document, rendered route by route;
- ``reference/code-layout.md``: each package and module of ``src/ffdl`` with the first
  paragraph of its docstring.

Generated, never written into ``docs/``: what the site says cannot drift from the code.
"""

from __future__ import annotations

import ast
import json
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "ffdl"
SETTINGS_SOURCE = SOURCE / "server" / "settings.py"
# Settings whose source has no comment to quote.
OWN_WORDS = {
    "home": "The platform's home: database, job directories, client config, secret key.",
    "host": "The address the API listens on (`ffdl up --host`).",
    "port": "The port the API listens on (`ffdl up --port`).",
}
HTTP_METHODS = ("get", "put", "post", "patch", "delete", "head", "options")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    document = _openapi_document()
    generated = {
        "operator/settings.md": settings_page(),
        "reference/http-api.md": http_api_page(document),
        "reference/openapi.json": json.dumps(document, indent=2) + "\n",
        "reference/code-layout.md": code_layout_page(),
    }
    for path, content in generated.items():
        files.append(File.generated(config, path, content=content))
    return files


# -- settings ------------------------------------------------------------------------------


def _field_comments() -> dict[str, str]:
    """Each ``Settings`` field's comment: the ``#`` lines right above it (up to a blank
    line or another field) and its trailing comment."""
    text = SETTINGS_SOURCE.read_text(encoding="utf-8")
    source_lines = text.splitlines()
    tree = ast.parse(text)
    settings = next(
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Settings"
    )
    comments: dict[str, str] = {}
    group = ""  # a comment above a run of fields (no blank line between) speaks for all
    previous_end = -1
    for node in settings.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        above: list[str] = []
        line = node.lineno - 2
        while line >= 0 and source_lines[line].strip().startswith("#"):
            above.insert(0, source_lines[line].strip().lstrip("#").strip())
            line -= 1
        if above:
            group = " ".join(above)
        elif line != previous_end - 1:
            group = ""
        end = node.end_lineno or node.lineno
        own = source_lines[end - 1]
        trailing = own.split("  # ", 1)[1].strip() if "  # " in own else ""
        comments[node.target.id] = " ".join(part for part in (group, trailing) if part)
        previous_end = end
    return comments


def _type_name(annotation: Any) -> str:
    text = str(annotation).replace("typing.", "").replace("pathlib.", "")
    for prefix in ("ffdl.server.settings.", "ffdl.backends.", "ffdl.server.services."):
        text = text.replace(prefix, "")
    if text.startswith("<class '") and text.endswith("'>"):
        text = text[len("<class '") : -2].rsplit(".", 1)[-1]
    return text.replace("NoneType", "None")


def _default(name: str, field: Any) -> str:
    if name == "home":
        return "`~/.ffdl`"
    if name == "learner_path":
        return "this interpreter's `bin`, then `PATH`"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is None:
        return "unset"
    if isinstance(value, str):
        return f"`{value}`"
    return f"`{json.dumps(value)}`" if isinstance(value, list | dict) else f"`{value!r}`"


def _constraints(field: Any) -> str:
    shown = []
    for item in field.metadata:
        for name, symbol in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            bound = getattr(item, name, None)
            if bound is not None:
                shown.append(f"{symbol} {bound}")
    return ", ".join(shown)


def settings_page() -> str:
    from ffdl.server.settings import Settings

    comments = _field_comments()
    rows = [
        "# Configuration reference",
        "",
        "Every setting of the platform, generated from the settings model "
        "(`ffdl.server.settings.Settings`). Each is read from `HOME/config.yaml` (the name as "
        "written here), then the environment (`FFDL_` and the name in capitals, which wins "
        "over the file), then `ffdl up`'s flags. A value the model refuses stops `ffdl up` "
        "naming the setting and the reason. How the most used ones fit together: "
        "[Configuring the platform](configuration.md).",
        "",
        "| setting | type | default | environment | what it does |",
        "|---|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        what = OWN_WORDS.get(name) or comments.get(name, "")
        bounds = _constraints(field)
        if bounds:
            what = f"{what} ({bounds})" if what else f"({bounds})"
        cells = [
            f"`{name}`",
            " or ".join(f"`{part.strip()}`" for part in _type_name(field.annotation).split("|")),
            _default(name, field),
            f"`FFDL_{name.upper()}`",
            what.replace("|", "\\|"),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


# -- HTTP API ------------------------------------------------------------------------------


def _openapi_document() -> dict[str, Any]:
    from ffdl.backends.fake import FakeBackend
    from ffdl.server.app import create_app
    from ffdl.server.settings import Settings

    with tempfile.TemporaryDirectory(prefix="ffdl-docs-") as home:
        settings = Settings(home=Path(home), sandbox=False)
        app = create_app(settings, backend=FakeBackend([]))
        document: dict[str, Any] = app.openapi()
    return document


def _first_paragraph(text: str | None) -> str:
    return (text or "").strip().split("\n\n", 1)[0].replace("\n", " ")


def http_api_page(document: dict[str, Any]) -> str:
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in document.get("paths", {}).items():
        for method in HTTP_METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            tag = (operation.get("tags") or ["other"])[0]
            by_tag.setdefault(tag, []).append((path, method, operation))
    out = [
        "# HTTP API reference",
        "",
        f"Generated from the server's own OpenAPI document (version "
        f"{document.get('info', {}).get('version', '?')}); a running server serves the same "
        "at `/openapi.json`, with interactive docs at `/docs`. Download it: "
        "[openapi.json](openapi.json). An overview of the API: [HTTP API](../api.md).",
        "",
    ]
    for tag in sorted(by_tag):
        out += [f"## {tag}", ""]
        for path, method, operation in sorted(by_tag[tag]):
            out += [f"### `{method.upper()} {path}`", ""]
            summary = operation.get("summary")
            description = _first_paragraph(operation.get("description"))
            if summary:
                out += [f"**{summary}.** {description}".rstrip(), ""]
            elif description:
                out += [description, ""]
            parameters = operation.get("parameters") or []
            if parameters:
                out += ["| parameter | in | required | type |", "|---|---|---|---|"]
                for parameter in parameters:
                    schema = parameter.get("schema") or {}
                    kind = schema.get("type") or "/".join(
                        str(option.get("type", "?")) for option in schema.get("anyOf", [])
                    )
                    out.append(
                        f"| `{parameter['name']}` | {parameter.get('in', '')} | "
                        f"{'yes' if parameter.get('required') else 'no'} | {kind or 'any'} |"
                    )
                out.append("")
            body = operation.get("requestBody")
            if body:
                media = ", ".join(f"`{name}`" for name in body.get("content", {}))
                out += [f"Request body: {media}.", ""]
            answers = ", ".join(
                f"{code} {_first_paragraph(answer.get('description'))}".strip()
                for code, answer in sorted(operation.get("responses", {}).items())
            )
            out += [f"Answers: {answers}.", ""]
    return "\n".join(out)


# -- code layout ---------------------------------------------------------------------------


def _docstring(path: Path) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return _first_paragraph(ast.get_docstring(tree))


def code_layout_page() -> str:
    out = [
        "# Code layout",
        "",
        "Each package and module of `src/ffdl`, with what its docstring says it owns "
        "(generated from the code). How they work together: [Architecture](../architecture.md).",
        "",
    ]
    for package in sorted(p for p in SOURCE.rglob("__init__.py")):
        directory = package.parent
        dotted = ".".join(directory.relative_to(SOURCE.parent).parts)
        out += [f"## `{dotted}`", ""]
        if summary := _docstring(package):
            out += [summary, ""]
        modules = sorted(p for p in directory.glob("*.py") if p.name != "__init__.py")
        if modules:
            out += ["| module | what it owns |", "|---|---|"]
            for module in modules:
                summary = _docstring(module).replace("|", "\\|")
                out.append(f"| `{module.stem}` | {summary} |")
            out.append("")
    return "\n".join(out)
