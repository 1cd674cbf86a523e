"""The report's blocks (headings, paragraphs, tables, images) and their two renderings, report.md and report.html."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path

# -- the report's blocks: what it says, written twice (report.md and report.html) ---------------------------------------
#
# A section is a list of blocks, and a block's text a str, a Code, a Strong or a tuple of them. A str is shown as
# it reads whatever characters it holds (each renderer escapes it), so what MLflow and Optuna hold (variant names,
# params, tags, error messages) can never turn into a link, an image, markup or a broken table. Only an Image
# shows a picture, and only a PNG the report wrote into its folder.


@dataclass(frozen=True)
class Code:
    """Text in a code font: a name, a file or a command, shown verbatim."""

    text: str


@dataclass(frozen=True)
class Strong:
    """Text in bold (the best mean of a row of the papers' table)."""

    text: str


@dataclass(frozen=True)
class Link:
    """A link to ``url`` (the MLflow UI's page of the study), shown as ``text``."""

    text: str
    url: str


Inline = str | Code | Strong | Link | tuple  # a tuple: a run of these


@dataclass(frozen=True)
class Heading:
    level: int
    text: Inline


@dataclass(frozen=True)
class Paragraph:
    text: Inline


@dataclass(frozen=True)
class Bullets:
    items: tuple[Inline, ...]


@dataclass(frozen=True)
class Table:
    """A header row and rows of as many cells."""

    header: tuple[Inline, ...]
    rows: tuple[tuple[Inline, ...], ...]

    def __post_init__(self) -> None:
        if any(len(row) != len(self.header) for row in self.rows):
            raise ValueError(f"Table: rows of {sorted({len(r) for r in self.rows})} cells under a header of {len(self.header)}")


@dataclass(frozen=True)
class Preformatted:
    """Text in a block of its own, lines and spaces kept (the best config's YAML)."""

    text: str
    language: str = ""


@dataclass(frozen=True)
class Image:
    """A PNG the report wrote into its folder, after ``caption`` on the same line."""

    path: Path
    alt: str
    caption: Inline = ()

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+\.png", self.path.name):
            raise ValueError(f"Image {self.path}: expected a PNG the report named (letters, digits, _ . -)")


Block = Heading | Paragraph | Bullets | Table | Preformatted | Image

MD_SPECIAL = frozenset("\\`*[]<>|#~$&")


def md_text(text: str) -> str:
    """``text`` as Markdown that reads as ``text``, on one line: the characters that would be markup escaped with a backslash.

    An ``_`` between two letters or digits is left alone (it can neither open nor close emphasis), so names like
    ``trial_0`` stay readable.
    """
    text = " ".join(text.splitlines())  # a line break would end a table's row or start a block

    def escaped(i: int, c: str) -> str:
        inside_word = c == "_" and 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()
        return "\\" + c if c in MD_SPECIAL or (c == "_" and not inside_word) else c

    return "".join(escaped(i, c) for i, c in enumerate(text))


def _fence(text: str, least: int) -> str:
    """Backticks that open and close ``text`` as code: more than the longest run of backticks in it."""
    return "`" * max(least, 1 + max(map(len, re.findall("`+", text)), default=0))


def _md_line(text: str) -> str:
    """Inline Markdown that starts a line (a paragraph, a list item), kept from starting a list or an indented code block."""
    return re.sub(r"^(?:[-+]|\d{1,9}[.)])", lambda m: m[0][:-1] + "\\" + m[0][-1], text.lstrip(" \t"))


def _md_inline(text: Inline, in_table: bool = False) -> str:
    if isinstance(text, tuple):
        return "".join(_md_inline(part, in_table) for part in text)
    if isinstance(text, Strong):
        return f"**{md_text(text.text)}**"
    if isinstance(text, Link):
        return f"[{md_text(text.text)}](<{text.url}>)"
    if isinstance(text, Code):  # no escapes inside a code span: its fence is longer than any run of backticks in it
        body = " ".join(text.text.splitlines())
        fence = _fence(body, 1)
        pad = " " if body[:1] in ("`", " ") or body[-1:] in ("`", " ") else ""
        return fence + pad + (body.replace("|", "\\|") if in_table else body) + pad + fence
    return md_text(str(text))


def _md_block(block: Block) -> str:
    match block:
        case Heading(level, text):
            return "#" * level + " " + _md_inline(text)
        case Paragraph(text):
            return _md_line(_md_inline(text))
        case Bullets(items):
            return "\n".join("- " + _md_line(_md_inline(item)) for item in items)
        case Table(header, rows):
            lines = ["| " + " | ".join(_md_inline(cell, in_table=True) for cell in row) + " |" for row in (header, *rows)]
            return "\n".join([lines[0], "|" + "---|" * len(header), *lines[1:]])
        case Preformatted(text, language):
            fence = _fence(text, 3)
            return f"{fence}{language}\n{text}\n{fence}"
        case Image(path, alt, caption):
            image = f"![{md_text(alt)}]({path.name})"
            return _md_line(f"{_md_inline(caption)} {image}") if caption else image
    raise TypeError(f"not a block of the report: {block!r}")


def markdown(blocks: list[Block]) -> str:
    """report.md: the blocks in Markdown (GitHub's, with tables), a blank line between two."""
    return "\n\n".join(map(_md_block, blocks)) + "\n"


HTML_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1100px; margin: 1.5em auto; padding: 0 1em;
       color: #1b1f24; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; display: block; max-width: 100%; overflow-x: auto; }
th, td { border: 1px solid #c9ced6; padding: 0.3em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f0f2f5; }
code { background: #f0f2f5; padding: 0.1em 0.3em; border-radius: 3px; }
pre { background: #f6f8fa; padding: 0.8em; overflow-x: auto; }
pre code { background: none; padding: 0; }
img { max-width: 100%; height: auto; border: 1px solid #e1e4e8; margin: 0.3em 0; }
"""

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _html_inline(text: Inline) -> str:
    if isinstance(text, tuple):
        return "".join(map(_html_inline, text))
    if isinstance(text, Strong):
        return f"<strong>{html.escape(text.text)}</strong>"
    if isinstance(text, Link):
        return f'<a href="{html.escape(text.url, quote=True)}">{html.escape(text.text)}</a>'

    if isinstance(text, Code):
        return f"<code>{html.escape(text.text)}</code>"
    return html.escape(str(text))


def _html_row(cells: tuple[Inline, ...], tag: str) -> str:
    return "<tr>" + "".join(f"<{tag}>{_html_inline(cell)}</{tag}>" for cell in cells) + "</tr>"


def _embedded_png(path: Path, alt: str, folder: Path) -> str:
    """``path`` as an <img> that holds its bytes (a data: URI), if it is a PNG file directly inside ``folder``, else a note.

    ``folder`` is the report's own: a link, a file elsewhere or one that is not a PNG is never read into the page.
    """
    inside = path.parent.resolve() == folder.resolve() and not path.is_symlink() and path.is_file()
    data = path.read_bytes() if inside else b""
    if not data.startswith(PNG_SIGNATURE):
        return f"[missing image {html.escape(path.name)}]"
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode("ascii")}">'


def _html_block(block: Block, folder: Path) -> str:
    match block:
        case Heading(level, text):
            return f"<h{level}>{_html_inline(text)}</h{level}>"
        case Paragraph(text):
            return f"<p>{_html_inline(text)}</p>"
        case Bullets(items):
            return "<ul>" + "".join(f"<li>{_html_inline(item)}</li>" for item in items) + "</ul>"
        case Table(header, rows):
            return "\n".join(["<table>", _html_row(header, "th"), *(_html_row(row, "td") for row in rows), "</table>"])
        case Preformatted(text):
            return f"<pre><code>{html.escape(text)}</code></pre>"
        case Image(path, alt, caption):
            return "<p>" + (_html_inline(caption) + " " if caption else "") + _embedded_png(path, alt, folder) + "</p>"
    raise TypeError(f"not a block of the report: {block!r}")


def html_page(blocks: list[Block], folder: Path, title: str) -> str:
    """report.html: the blocks as one self-contained page, its images (PNGs of ``folder``) embedded as data: URIs.

    The page needs no other file and renders in MLflow's artifact viewer; nothing is fetched and no script runs.
    """
    body = "\n".join(_html_block(block, folder) for block in blocks)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
        f"<style>{HTML_STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


# -- the command -----------------------------------------------------------------------------------------------------
