"""Fuzzing the persona loader with generated frontmatter (hypothesis).

Whatever the text, :func:`parse_persona` either returns a persona or raises :class:`PersonaError`
(which the registry turns into a warning), and its memory stays bounded. A persona it returns
is one the rest of the runtime can handle: written back as a file and as JSON (the registry's
digest and every listing do both) and read again. No timing is asserted; the bench script
``bench/fuzz_loader.py`` reports how long hostile and random files take.
"""

from __future__ import annotations

import contextlib
import json
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry.errors import PersonaError
from registry.parser import dump_persona, parse_persona
from registry.persona import FILE_FIELDS

#: Peak memory one example may use: generous, far below what an unbounded expansion takes.
PEAK_BYTES = 64 * 1024 * 1024

_KEYS = st.one_of(
    st.sampled_from(FILE_FIELDS),
    st.sampled_from(["color", "hooks", "mcp_servers", "on", "yes", "null", "<<", "x.y", "a-b"]),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,12}", fullmatch=True),
)
_WORDS = st.text(
    alphabet=st.sampled_from(
        list("abc xyz019_-.,:#*&!|>'\"[]{}()%@`?~=\\/\t") + ["é", "ß", "日", "🙂", "\u200b"]
    ),
    max_size=40,
)
_ANCHOR = st.sampled_from(["a", "b", "c", "l0", "l1"])
#: Scalars YAML reads specially: tags, timestamps, bases, block indicators, quotes.
_SPECIAL = [
    "", "~", "null", "true", "no", ".inf", "-.nan", "0x1F", "0o17", "1:2:3", "1_000",
    "2021-13-01", "2001-12-14t21:59:43.10-05:00", "!!binary aGVsbG8=", "!!binary /w==",
    "!!set {a, b}", "!!omap [a: 1, b: 2]", "!!str 5", "!!int x", "!!float y",
    "|", ">-", "'unclosed", '"unclosed', "'it''s'", '"esc \\x41 \\u00e9 \\q"',
    "**bold** text", "Use when: disks fill", "{{.incident_id}}", "{{ range . }}",
]  # fmt: skip
_SCALARS = st.one_of(
    _WORDS,
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(_SPECIAL),
    _ANCHOR.map(lambda a: f"*{a}"),
    st.tuples(_ANCHOR, _WORDS).map(lambda t: f"&{t[0]} {t[1]}"),
    st.integers(min_value=1, max_value=3000).map(lambda n: "x" * n),  # very long lines
)


@st.composite
def _flow(draw: st.DrawFn, depth: int = 0) -> str:
    """A flow list or map, sometimes unclosed, sometimes nested."""
    items = draw(
        st.lists(
            _flow(depth + 1) if depth < 3 and draw(st.booleans()) else _SCALARS,
            max_size=5,
        )
    )
    if draw(st.booleans()):
        opening, closing, body = "[", "]", ", ".join(items)
    else:
        opening, closing = "{", "}"
        body = ", ".join(f"{draw(_KEYS)}: {item}" for item in items)
    closing = draw(st.sampled_from([closing, closing, "", "]", "}"]))
    return f"{opening}{body}{closing}"


@st.composite
def _block(draw: st.DrawFn) -> str:
    """Indented lines under a key: ``- `` items, ``key:`` lines, or continuation text."""
    indent = draw(st.sampled_from(["  ", "    ", "\t", " "]))
    lines = []
    for _ in range(draw(st.integers(min_value=1, max_value=5))):
        kind = draw(st.sampled_from(["item", "key", "text", "flow"]))
        if kind == "item":
            lines.append(f"{indent}- {draw(_SCALARS)}")
        elif kind == "key":
            lines.append(f"{indent}{draw(_KEYS)}: {draw(_SCALARS)}")
        elif kind == "flow":
            lines.append(f"{indent}- {draw(_flow())}")
        else:
            lines.append(f"{indent}{draw(_WORDS)}")
    return "\n" + "\n".join(lines)


@st.composite
def _laughs(draw: st.DrawFn) -> str:
    """Anchors of lists of aliases of the anchor before: width ** levels values as expanded."""
    levels = draw(st.integers(min_value=1, max_value=10))
    width = draw(st.integers(min_value=1, max_value=12))
    inline = draw(st.booleans())
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for level in range(1, levels):
        aliases = [f"*l{level - 1}"] * width
        if inline:
            lines.append(f"l{level}: &l{level} [{', '.join(aliases)}]")
        else:
            lines.append(f"l{level}: &l{level}\n" + "\n".join(f"  - {a}" for a in aliases))
    key = draw(_KEYS)
    return f"{key}:\n" + "\n".join("  " + ln.replace("\n", "\n  ") for ln in lines)


_DEEP = st.integers(min_value=1, max_value=1500).map(lambda n: "[" * n + "]" * n)
_VALUES = st.one_of(_SCALARS, _flow(), _block(), _DEEP)


@st.composite
def _line(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["pair", "pair", "pair", "comment", "blank", "stray", "laughs"]))
    if kind == "pair":
        return f"{draw(_KEYS)}:{draw(st.sampled_from([' ', '  ', chr(9)]))}{draw(_VALUES)}"
    if kind == "comment":
        return f"# {draw(_WORDS)}"
    if kind == "blank":
        return draw(st.sampled_from(["", "  ", "\t"]))
    if kind == "stray":
        return draw(_WORDS)
    return draw(_laughs())


@st.composite
def persona_texts(draw: st.DrawFn) -> str:
    # Mostly valid required fields, so that most examples get past validation to the rest.
    text = st.one_of(st.just("Some text."), st.just("Use when: disks fill"), _SCALARS)
    required = [
        f"name: {draw(st.sampled_from(['fuzz'] * 6 + ['fuzz-me', 'Bad Name', '']))}",
        f"description: {draw(text)}",
        f"when_to_use: {draw(text)}",
    ]
    lines = draw(st.permutations(required + draw(st.lists(_line(), max_size=8))))
    newline = draw(st.sampled_from(["\n", "\n", "\r\n"]))
    closing = draw(st.sampled_from(["---"] * 8 + ["-----", ""]))
    body = draw(st.text(max_size=60))
    bom = draw(st.sampled_from(["", "", "\ufeff"]))
    return bom + newline.join(["---", *lines, closing]) + newline + body


def _loaded_persona_is_usable(text: str) -> None:
    try:
        parsed = parse_persona(text, path="fuzz.md")
    except PersonaError as exc:
        assert exc.path == "fuzz.md" and exc.reason
        return
    persona = parsed.persona
    # What the registry (digest), the CLI (validate --json) and the API (describe) do with it.
    json.dumps(persona.model_dump(mode="json"), ensure_ascii=False)
    written = dump_persona(persona)
    # Read again it may be refused (an omap comes back as a list of pairs), never a crash.
    with contextlib.suppress(PersonaError):
        parse_persona(written)


@settings(
    max_examples=300,
    deadline=None,
    database=None,  # nothing written into the checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(persona_texts())
def test_parse_persona_raises_only_persona_error_within_bounded_memory(text: str) -> None:
    tracemalloc.start()
    try:
        _loaded_persona_is_usable(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"{peak} bytes for a {len(text)}-character file"


@settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.text(max_size=400))
def test_arbitrary_text_after_the_opening_line(text: str) -> None:
    _loaded_persona_is_usable("---\n" + text)
