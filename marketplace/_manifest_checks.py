"""The load-time checks of a skill manifest: schemas, templates, scripts, URLs and headers.

Each check raises :class:`_Problem` with the key it is about; :func:`marketplace.manifest.
load_manifest` gathers them into one :class:`~marketplace.manifest.ManifestError` naming the
file. What can be refused here is refused before any model sees the tool: shell
metacharacters in a template, a script outside the bundle's ``scripts/``, a schema that is not
one or fetches a remote ``$ref``, a placeholder that names no declared argument, a header that
fakes the request's framing or reads a variable other than ``ONGRID_SKILL_*``.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import string
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema import exceptions as schema_errors

from marketplace._executors import _BRACES, _ENV_REFERENCE

__all__ = ["SHELL_METACHARACTERS"]

#: Characters refused in a command and in argv templates: they mean something only to a shell
#: (separators, pipes, redirections, substitutions, globs, quotes, escapes, comments, home and
#: history expansion), so nobody may believe they work. Whitespace too: one list item is one
#: argv element, never split.
SHELL_METACHARACTERS = frozenset(";|&$`<>*?()[]{}~!#'\"\\") | frozenset(string.whitespace)
_PLACEHOLDER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_NAME = re.compile(r"^ONGRID_SKILL_[A-Z0-9_]+$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
#: Headers the HTTP client sets itself from the request; a manifest must not fake them.
_FRAMING_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


class _Problem(Exception):
    """One check that failed; the message is the reason, :attr:`where` the key it is about."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(reason)
        self.where = where


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


# -- checks ------------------------------------------------------------------------------------


def _json_problem(value: Any) -> str:
    """Why ``value`` is not plain JSON (YAML can also write dates, sets, binary, infinities)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if any(not isinstance(k, str) for k in item):
                return "a mapping key is not a string"
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float) and not math.isfinite(item):
            return "holds an infinite or NaN number, which JSON cannot write"
        elif not isinstance(item, str | int | float | bool) and item is not None:
            return f"holds a {type(item).__name__}, which is not JSON"
    return ""


def _walk_refs(schema: Any) -> Iterator[str]:
    stack = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key in ("$ref", "$dynamicRef", "$recursiveRef") and isinstance(value, str):
                    yield value
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)


def _check_schema(schema: dict[str, Any]) -> type[Any]:
    """The validator class for ``schema``; :class:`_Problem` if it is not an object schema."""
    problem = _json_problem(schema)
    if problem:
        raise _Problem("parameters", problem)
    if schema.get("type") != "object":
        raise _Problem("parameters", "must be a JSON schema with type: object")
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not all(
        isinstance(p, dict) for p in properties.values()
    ):
        raise _Problem("parameters.properties", "must map each argument's name to its schema")
    required = schema.get("required", [])
    if not isinstance(required, list) or any(r not in properties for r in required):
        raise _Problem("parameters.required", "must list names of declared properties")
    for ref in _walk_refs(schema):
        if not ref.startswith("#"):
            raise _Problem("parameters", f"$ref {ref!r} is not local: only '#/...' refs are read")
    # No $schema: the current draft. An unknown one is refused rather than guessed at.
    cls: Any = Draft202012Validator
    if "$schema" in schema:
        cls = validators.validator_for(schema, default=None)
        if cls is None:
            dialect = schema["$schema"]
            raise _Problem("parameters.$schema", f"unknown JSON Schema dialect {dialect!r}")
    try:
        cls.check_schema(schema)
    except schema_errors.SchemaError as exc:
        where = f"parameters{exc.json_path[1:]}"
        raise _Problem(where, f"not a valid JSON schema: {exc.message}") from None
    return cls  # type: ignore[no-any-return]


def _placeholders(text: str, where: str, *, escapes: bool = False) -> list[str]:
    """The names of the ``{param}`` placeholders of ``text``; a stray brace is refused
    (``{{`` and ``}}`` stand for braces where ``escapes`` allows them: in a body)."""
    names = []
    for match in _BRACES.finditer(text):
        token = match.group(0)
        if token in ("{{", "}}") and escapes:
            continue
        name = match.group(1)
        if name is None or not _PLACEHOLDER_NAME.match(name):
            hint = " (write {{ or }} for a brace)" if escapes else ""
            raise _Problem(where, f"{token!r} in {text!r} is not a {{param}} placeholder{hint}")
        names.append(name)
    return names


def _check_names(names: list[str], schema: dict[str, Any], where: str) -> None:
    properties, required = schema["properties"], set(schema.get("required", []))
    for name in names:
        if name not in properties:
            known = ", ".join(sorted(properties)) or "none"
            raise _Problem(
                where,
                f"placeholder {{{name}}} is not a property of parameters (declared: {known})",
            )
        if name not in required and "default" not in properties[name]:
            raise _Problem(
                where,
                f"placeholder {{{name}}} names an optional property without a default: list it "
                "in parameters.required or give it a default",
            )


def _no_metacharacters(text: str, where: str) -> None:
    bad = sorted(SHELL_METACHARACTERS & set(_BRACES.sub("", text)))
    if bad:
        shown = " ".join(repr(c) for c in bad)
        raise _Problem(
            where,
            f"{text!r} contains shell metacharacters {shown}: scripts run without a shell; "
            "each args item is one argv element, placeholders are filled as one element each",
        )


def _script(command: str, manifest_dir: Path, bundle_root: Path, interpreter: str | None) -> Path:
    where = "run.command"
    if _BRACES.search(command):
        raise _Problem(where, "the command is fixed: placeholders belong in args")
    _no_metacharacters(command, where)
    if os.path.isabs(command):
        raise _Problem(where, f"{command!r} is absolute: name a file of the bundle's scripts/")
    parts = Path(command).parts
    if ".." in parts:
        raise _Problem(where, f"{command!r} goes up with '..': it must stay inside the bundle")
    if len(parts) < 2 or parts[0] != "scripts":
        raise _Problem(where, f"{command!r} is not under scripts/ (next to the manifest)")
    real = os.path.realpath(manifest_dir / command)
    scripts = os.path.join(os.path.realpath(manifest_dir), "scripts")
    if not _inside(real, os.path.realpath(bundle_root)) or not _inside(real, scripts):
        raise _Problem(where, f"{command!r} leads outside the bundle's scripts/ (symbolic link)")
    if not os.path.exists(real):
        raise _Problem(where, f"{command!r} does not exist")
    if not os.path.isfile(real):
        raise _Problem(where, f"{command!r} is not a regular file")
    if interpreter is None and not os.access(real, os.X_OK):
        raise _Problem(where, f"{command!r} is not executable: set interpreter, or chmod +x it")
    return Path(real)


def _check_url(url: str, schema: dict[str, Any]) -> None:
    where = "http.url"
    if any(c in string.whitespace or ord(c) < 32 or ord(c) == 127 for c in url):
        raise _Problem(where, "the URL contains whitespace or control characters")
    _check_names(_placeholders(url, where), schema, where)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _Problem(where, f"{url!r} is not an http(s) URL with a host")
    if _BRACES.search(parts.scheme + "://" + parts.netloc):
        raise _Problem(where, "placeholders may fill the path and query only, never the host")
    if parts.username is not None or parts.password is not None:
        raise _Problem(where, "no credentials in the URL: send them in a header")
    if parts.fragment:
        raise _Problem(where, "a URL fragment (#...) is never sent: remove it")
    if _metadata_host(parts.hostname):
        raise _Problem(
            where,
            f"{parts.hostname} is a link-local or cloud metadata address: the worker's own "
            "credentials live there, and a manifest may not ask for them",
        )


#: Names of cloud metadata services (their addresses are link-local, refused below too).
_METADATA_NAMES = frozenset({"metadata", "metadata.google.internal", "instance-data"})


def _metadata_host(host: str) -> bool:
    """Whether ``host``, as written, names a link-local address or a metadata service."""
    name = host.lower().rstrip(".")
    if name in _METADATA_NAMES or name.endswith(".metadata.google.internal"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    return address.is_link_local or str(address) in {"100.100.100.200", "fd00:ec2::254"}


def _check_headers(headers: Mapping[str, str]) -> None:
    for name, value in headers.items():
        where = f"http.headers.{name}"
        if not _HEADER_NAME.match(name):
            raise _Problem(where, "is not a valid header name")
        if name.lower() in _FRAMING_HEADERS:
            raise _Problem(where, "is set by the HTTP client itself and may not be given")
        if any(c in value for c in "\r\n\0"):
            raise _Problem(where, "holds a line break or NUL character")
        for match in _ENV_REFERENCE.finditer(value):
            if not _ENV_NAME.match(match.group(1)):
                raise _Problem(
                    where,
                    f"${{{match.group(1)}}}: only ONGRID_SKILL_* variables of the worker's "
                    "environment may be used in headers",
                )
        if re.search(r"(?<!\$)\{[A-Za-z_][A-Za-z0-9_]*\}", value):
            raise _Problem(where, "headers are fixed: placeholders belong in url and body")


def _check_body(body: Any, schema: dict[str, Any]) -> None:
    problem = _json_problem(body)
    if problem:
        raise _Problem("http.body", problem)
    stack = [body]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _check_names(_placeholders(item, "http.body", escapes=True), schema, "http.body")
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
