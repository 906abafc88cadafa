"""Command lines parsed the way GNU ``getopt_long`` parses them, against a declared option table.

A :class:`Command` declares every option a program may take. Each option is written as its names
joined by ``/`` and a suffix that says whether it takes a value, as the program declares it::

    -h/--human-readable      a flag
    -B/--block-size=         a required value (-B1K, -B 1K, --block-size=1K, --block-size 1K)
    -X/--exclude-from=FILE   a required value that is a file the command reads (FILE, PATH, NUMBER)
    --output[=]              an optional value, only attached (--output=source)
    -n/--lines[=]+           optional, or the next word when it reads as a number (journalctl)

Parsing follows getopt: clusters (``-rn``), attached values (``-n20``), ``--`` ending the options,
options after operands (permutation). It differs in one way on purpose: a long option must be
written in full, because getopt's unambiguous prefixes (``--s`` for ``--set``) would let a name
that is not in the table through.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["Arg", "Command", "CommandRefused", "Kind", "Option", "Parsed", "parse_arguments"]


class CommandRefused(Exception):
    """The command is not allowed; the message says why and what to do instead."""


class Arg(Enum):
    """Whether an option takes a value, as its program's getopt declares it."""

    NONE = "none"
    REQUIRED = "required"
    OPTIONAL = "optional"
    OPTIONAL_NEXT_NUMBER = "optional, or the next word if it is a number"


class Kind(Enum):
    """What an option value or an operand is, and so how it is checked."""

    TEXT = "text"
    NUMBER = "number"
    #: A file whose content the command prints: must lie under the readable roots.
    FILE = "file"
    #: A path the command only looks at (sizes, metadata): anything the sandbox shows.
    PATH = "path"


@dataclass(frozen=True)
class Option:
    names: tuple[str, ...]
    arg: Arg = Arg.NONE
    kind: Kind = Kind.TEXT
    #: Non-empty: the option is refused, and this says why.
    refused: str = ""


_SUFFIX = re.compile(r"^(?P<names>[^=\[]+)(?P<arg>=|\[=\]\+?)?(?P<kind>FILE|PATH|NUMBER)?$")


def _option(token: str, refused: str = "") -> Option:
    match = _SUFFIX.match(token)
    if match is None:
        raise ValueError(f"bad option declaration {token!r}")
    arg = {None: Arg.NONE, "=": Arg.REQUIRED, "[=]": Arg.OPTIONAL, "[=]+": Arg.OPTIONAL_NEXT_NUMBER}
    kind = Kind[match["kind"]] if match["kind"] else Kind.TEXT
    return Option(tuple(match["names"].split("/")), arg[match["arg"]], kind, refused)


@dataclass
class Parsed:
    """A command line split into the options given (with their values) and operands."""

    options: list[tuple[str, Option, str | None]] = field(default_factory=list)
    operands: list[str] = field(default_factory=list)

    def given(self, *names: str) -> bool:
        return any(name in names for name, _, _ in self.options)

    def values(self, *names: str) -> list[str]:
        return [v for name, _, v in self.options if name in names and v is not None]


@dataclass(frozen=True)
class Command:
    """What one executable may be given: ``options`` in the notation of the module docstring,
    ``refused`` options by the reason given for refusing them (their names only)."""

    options: str = ""
    refused: Mapping[str, str] = field(default_factory=dict)
    #: What the operands are; ``None``: the command takes none.
    operands: Kind | None = None
    max_operands: int | None = None
    #: The option an obsolete ``-NUM`` stands for (``head -20`` is ``head -n 20``).
    numeric: str = ""
    check: Callable[[Parsed], None] | None = None
    _by_name: dict[str, Option] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        declared = [_option(t) for t in ("--help", "--version", *self.options.split())]
        declared += [_option(t, why) for why, ts in self.refused.items() for t in ts.split()]
        by_name: dict[str, Option] = {}
        for option in declared:
            for name in option.names:
                if name in by_name:
                    raise ValueError(f"option {name} is declared twice")
                by_name[name] = option
        object.__setattr__(self, "_by_name", by_name)

    def option(self, name: str) -> Option | None:
        return self._by_name.get(name)

    def declared(self) -> list[Option]:
        """Every option, once, allowed and refused alike."""
        return list({id(o): o for o in self._by_name.values()}.values())

    def long_names(self) -> list[str]:
        return sorted(n for n, o in self._by_name.items() if n.startswith("--") and not o.refused)


def parse_arguments(name: str, command: Command, args: Sequence[str]) -> Parsed:
    """Split ``args`` as GNU ``getopt_long`` would (with permutation), refusing whatever the
    table does not name or names as refused."""
    parsed, i, only_operands = Parsed(), 0, False
    while i < len(args):
        arg = args[i]
        if only_operands or arg == "-" or not arg.startswith("-"):
            parsed.operands.append(arg)
        elif arg == "--":
            only_operands = True
        elif arg.startswith("--"):
            i = _parse_long(name, command, args, i, parsed)
        elif command.numeric and arg[1:].isdigit():
            option = command.option(command.numeric)
            assert option is not None, command.numeric
            parsed.options.append((command.numeric, option, arg[1:]))
        else:
            i = _parse_cluster(name, command, args, i, parsed)
        i += 1
    return parsed


def _known(name: str, command: Command, option_name: str) -> Option:
    option = command.option(option_name)
    if option is None:
        hint = (
            " (long options must be written in full; "
            f"{name} accepts: {', '.join(command.long_names())})"
            if option_name.startswith("--")
            else ""
        )
        raise CommandRefused(f"{name} {option_name} is not an allowed option{hint}")
    if option.refused:
        raise CommandRefused(f"{name} {option_name} is not allowed: {option.refused}")
    return option


def _parse_long(name: str, command: Command, args: Sequence[str], i: int, parsed: Parsed) -> int:
    option_name, eq, given = args[i].partition("=")
    option = _known(name, command, option_name)
    value: str | None = given if eq else None
    if option.arg is Arg.NONE and eq:
        raise CommandRefused(f"{name} {option_name} takes no value")
    if option.arg is Arg.REQUIRED and not eq:
        if i + 1 >= len(args):
            raise CommandRefused(f"{name} {option_name} needs a value")
        i, value = i + 1, args[i + 1]
    if option.arg is Arg.OPTIONAL_NEXT_NUMBER and not eq and _next_is_number(args, i):
        i, value = i + 1, args[i + 1]
    parsed.options.append((option_name, option, value))
    return i


def _parse_cluster(name: str, command: Command, args: Sequence[str], i: int, parsed: Parsed) -> int:
    cluster = args[i][1:]
    for j, char in enumerate(cluster):
        option_name = f"-{char}"
        option = _known(name, command, option_name)
        if option.arg is Arg.NONE:
            parsed.options.append((option_name, option, None))
            continue
        rest = cluster[j + 1 :]
        value: str | None = rest or None
        if not rest and option.arg is Arg.REQUIRED:
            if i + 1 >= len(args):
                raise CommandRefused(f"{name} {option_name} needs a value")
            i, value = i + 1, args[i + 1]
        elif not rest and option.arg is Arg.OPTIONAL_NEXT_NUMBER and _next_is_number(args, i):
            i, value = i + 1, args[i + 1]
        parsed.options.append((option_name, option, value))
        break
    return i


def _next_is_number(args: Sequence[str], i: int) -> bool:
    return i + 1 < len(args) and re.fullmatch(r"[+-]?\d+|all", args[i + 1]) is not None
