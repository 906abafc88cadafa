"""The guard of ``query_clickhouse_system``: one SELECT that reads only ``system.*`` tables.

This is the second line. The first is the server: the tool connects as a ClickHouse user that
may only read the ``system`` database, with ``readonly=1`` (see the README). The guard refuses
early, with a reason a model can act on, what that user would be refused anyway.

The SQL is split by a tokenizer that follows ClickHouse's own quoting: ``'strings'`` (with
``\\`` escapes and ``''``), ``"identifiers"`` and ```identifiers``` (same escapes), ``--`` and
``/* */`` comments. Constructs whose meaning differs between ClickHouse versions (``#`` comments,
nested ``/*``, ``$heredoc$`` strings) are refused rather than guessed at. On the tokens:

* every table a FROM clause names (after ``FROM``, after each ``,`` of the clause, after
  ``JOIN``) is ``system.<table>``, or a subquery; table functions are refused, except
  ``cluster('name', system.<table>)`` and ``clusterAllReplicas``;
* ``x IN <table>`` names a table too, and is checked the same way;
* functions that read outside the query (``url``, ``file``, ``remote``, ``dictGet``, ``joinGet``,
  ``hasColumnInTable``, the ``in(x, table)`` forms…) are refused wherever they appear.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["SqlRefused", "Token", "check_system_select", "tokenize"]


class SqlRefused(Exception):
    """SQL the tool will not send; the message says what is allowed."""


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # word, quoted (identifier), string, number, punct, comment, space
    text: str
    start: int

    @property
    def name(self) -> str:
        """An identifier's name: unquoted, escapes resolved; a word as written."""
        if self.kind != "quoted":
            return self.text
        body = self.text[1:-1]
        quote = self.text[0]
        return re.sub(r"\\(.)", r"\1", body).replace(quote * 2, quote)

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""

    @property
    def is_identifier(self) -> bool:
        return self.kind in ("word", "quoted")


_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"(?:0[xX][0-9A-Fa-f]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)")
_PUNCT = re.compile(r"->|<=|>=|!=|<>|==|\|\||::|[-+*/%=<>(),.\[\]{}:?;!|&^~@]")


def _quoted(sql: str, i: int) -> int:
    """The end of the quoted token opened at ``i`` (``\\`` escapes, a doubled quote)."""
    quote, j = sql[i], i + 1
    while j < len(sql):
        char = sql[j]
        if char == "\\":
            j += 2
            continue
        if char == quote:
            if j + 1 < len(sql) and sql[j + 1] == quote:
                j += 2
                continue
            return j + 1
        j += 1
    what = "string literal" if quote == "'" else "quoted identifier"
    raise SqlRefused(f"unterminated {what} starting at character {i + 1}")


def tokenize(sql: str) -> Iterator[Token]:
    """ClickHouse tokens, comments and spaces included, covering ``sql`` exactly."""
    i = 0
    while i < len(sql):
        char = sql[i]
        if match := _SPACE.match(sql, i):
            yield Token("space", match.group(), i)
            i = match.end()
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            end = len(sql) if end < 0 else end
            yield Token("comment", sql[i:end], i)
            i = end
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            if end < 0:
                raise SqlRefused("unterminated /* comment")
            if "/*" in sql[i + 2 : end]:
                raise SqlRefused("nested /* comments are not accepted")
            yield Token("comment", sql[i : end + 2], i)
            i = end + 2
        elif char in "'\"`":
            end = _quoted(sql, i)
            yield Token("string" if char == "'" else "quoted", sql[i:end], i)
            i = end
        elif char in "#$":
            raise SqlRefused(f"{char!r} is not accepted outside strings (comments are -- or /* */)")
        elif match := _NUMBER.match(sql, i):
            yield Token("number", match.group(), i)
            i = match.end()
        elif match := _WORD.match(sql, i):
            yield Token("word", match.group(), i)
            i = match.end()
        elif match := _PUNCT.match(sql, i):
            yield Token("punct", match.group(), i)
            i = match.end()
        else:
            raise SqlRefused(f"unexpected character {char!r} at {i + 1}")


#: Functions that read other tables, files or hosts wherever they appear (lower case).
_OUTSIDE_READERS = re.compile(
    r"^(url|file|s3\w*|gcs|hdfs\w*|azureblobstorage\w*|remote\w*|mysql|postgresql|mongodb|redis|"
    r"jdbc|odbc|sqlite|input|executable\w*|dict\w*|joinget\w*|hascolumnintable|"
    r"merge|view|viewifpermitted|iceberg\w*|deltalake\w*|hudi\w*|"
    r"generaterandom|values|loop|catboostevaluate|modelevaluate|filesystem\w*)$"
)
_CLUSTER_FUNCTIONS = {"cluster", "clusterallreplicas"}
#: ``x IN (…)`` and the ``in(x, …)`` functions: a qualified name among their arguments is a table.
_IN_FAMILY = {
    "in", "notin", "globalin", "globalnotin", "nullin", "notnullin", "globalnullin",
    "globalnotnullin",
}  # fmt: skip
#: FROM and IN inside these calls are syntax, not tables: extract(DAY FROM t), position(a IN b).
_SYNTAX_CALLS = {"extract", "trim", "substring", "position", "overlay"}
#: Words that end a FROM clause at its own depth.
_CLAUSE_ENDS = {
    "WHERE", "PREWHERE", "GROUP", "ORDER", "LIMIT", "HAVING", "UNION", "SETTINGS", "FORMAT",
    "WINDOW", "QUALIFY", "INTO", "EXCEPT", "INTERSECT", "OFFSET",
}  # fmt: skip
#: Words that may follow a table without being its alias.
_NOT_ALIAS = _CLAUSE_ENDS | {
    "AS", "FINAL", "SAMPLE", "JOIN", "ARRAY", "LEFT", "RIGHT", "INNER", "FULL", "CROSS", "ANY",
    "ALL", "ASOF", "GLOBAL", "SEMI", "ANTI", "OUTER", "PASTE", "ON", "USING", "LOCAL",
}  # fmt: skip


class _Checker:
    def __init__(self, tokens: list[Token]) -> None:
        self.t = tokens  # without spaces and comments
        self.calls: list[str] = []  # per open parenthesis: the function it belongs to, or ""

    def at(self, i: int) -> Token | None:
        return self.t[i] if 0 <= i < len(self.t) else None

    def word_at(self, i: int) -> str:
        """The keyword at ``i`` in upper case; "" for anything else or nothing."""
        token = self.at(i)
        return token.upper if token is not None else ""

    def is_punct(self, i: int, text: str) -> bool:
        token = self.at(i)
        return token is not None and token.kind == "punct" and token.text == text

    def run(self) -> None:
        from_depth: int | None = None  # paren depth of the FROM clause being read, if any
        from_stack: list[int | None] = []
        for i, token in enumerate(self.t):
            if token.kind == "punct" and token.text in "([":
                from_stack.append(from_depth)
                from_depth = None
                self.calls.append(self._call_name(i))
                continue
            if token.kind == "punct" and token.text in ")]":
                if self.calls:
                    self.calls.pop()
                    from_depth = from_stack.pop()
                continue
            depth = len(self.calls)
            enclosing = self.calls[-1] if self.calls else ""
            if token.is_identifier and self.is_punct(i + 1, "("):
                self._check_function(token)
            word = token.upper
            if word == "FROM" and enclosing not in _SYNTAX_CALLS:
                from_depth = depth
                self._table(i + 1)
            elif word == "JOIN" and self.word_at(i - 1) != "ARRAY":
                self._table(i + 1)
            elif word in _CLAUSE_ENDS and from_depth == depth:
                from_depth = None
            elif token.kind == "punct" and token.text == "," and from_depth == depth:
                self._table(i + 1)
            elif word == "IN" and enclosing not in _SYNTAX_CALLS:
                following = self.at(i + 1)
                if following is not None and following.is_identifier:
                    self._table(i + 1)
            if enclosing in _IN_FAMILY and (self.is_punct(i - 1, "(") or self.is_punct(i - 1, ",")):
                self._in_argument(i)

    def _in_argument(self, i: int) -> None:
        """An argument of IN (…) or in(x, …): ``db.table`` there names a table."""
        token = self.at(i)
        if token is None or not token.is_identifier:
            return
        parts, j = self._compound(i)
        if len(parts) == 2 and not self.is_punct(j, "("):
            self._table(i)

    def _call_name(self, i: int) -> str:
        before = self.at(i - 1)
        return before.name.lower() if before is not None and before.is_identifier else ""

    @staticmethod
    def _check_function(token: Token) -> None:
        name = token.name.lower()
        if _OUTSIDE_READERS.match(name):
            raise SqlRefused(f"{token.name}() reads outside the system database")

    def _table(self, i: int) -> None:
        """The table element starting at token ``i``: a subquery, or ``system.<table>``."""
        first = self.at(i)
        if first is None:
            raise SqlRefused("a table name is missing")
        if first.kind == "punct" and first.text == "(":
            return  # a subquery: its own FROM clauses are checked as they come
        if first.upper == "ARRAY" or (first.upper == "SELECT"):
            return
        parts, j = self._compound(i)
        if self.is_punct(j, "("):
            self._table_function(parts, j)
            return
        if len(parts) != 2 or parts[0] != "system":
            shown = ".".join(parts)
            raise SqlRefused(
                f"{shown} is not a table of the system database; only system.* tables may be "
                "read (write them qualified, e.g. system.parts)"
            )

    def _compound(self, i: int) -> tuple[list[str], int]:
        parts: list[str] = []
        while True:
            token = self.at(i)
            if token is None or not token.is_identifier:
                raise SqlRefused("expected a table name (system.<table>) after FROM, JOIN or IN")
            parts.append(token.name)
            if not self.is_punct(i + 1, "."):
                return parts, i + 1
            i += 2

    def _table_function(self, parts: list[str], j: int) -> None:
        name = ".".join(parts)
        if len(parts) == 1 and name.lower() in _CLUSTER_FUNCTIONS:
            # cluster('name', system.x): the same system query on every replica.
            first, comma = self.at(j + 1), self.at(j + 2)
            if (
                first is not None
                and first.kind in ("string", "word", "quoted")
                and comma is not None
                and comma.text == ","
            ):
                target, end = self._compound(j + 3)
                if len(target) == 2 and target[0] == "system" and self.is_punct(end, ")"):
                    return
        raise SqlRefused(f"table function {name}() is not allowed; read system.* tables only")


def check_system_select(sql: str) -> str:
    """Return ``sql`` ready to send (comments and a trailing ``;`` removed), or raise
    :class:`SqlRefused` unless it is one SELECT reading only ``system.*`` tables."""
    tokens = list(tokenize(sql))
    sendable = "".join(" " if t.kind == "comment" else t.text for t in tokens).strip()
    code = [t for t in tokens if t.kind not in ("space", "comment")]
    while code and code[-1].text == ";":
        code.pop()
        sendable = sendable.rstrip().removesuffix(";")
    sendable = sendable.rstrip()
    if any(t.kind == "punct" and t.text == ";" for t in code):
        raise SqlRefused("send one statement at a time")
    if not code or code[0].upper != "SELECT":
        raise SqlRefused("only a single SELECT statement is allowed")
    for i, token in enumerate(code):
        following = code[i + 1] if i + 1 < len(code) else None
        if token.upper == "OUTFILE" or (
            token.upper == "FORMAT" and not (following and following.text == "(")
        ):
            raise SqlRefused("leave out INTO OUTFILE / FORMAT: the tool chooses the output format")
    _Checker(code).run()
    return sendable
