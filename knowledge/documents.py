"""Uploaded files -> plain text in sections (pure: bytes in, text out; pypdf reads PDFs).

A `Document` is its sections in order; a `Section` is the text under one heading, with
its heading path ("Clinic > Opening hours"), or None for text before the first heading.
A section's text holds one block (paragraph, list item, table row) per line: the chunker
never joins a sentence across two blocks, so list items without full stops stay apart.

The kind comes from the file name's extension, else from the content type; a file is
checked against its kind (a .pdf must be a PDF, text must be UTF-8) and refused with an
error that names it and says what to do.
"""

from __future__ import annotations

import codecs
import io
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import PurePath

from knowledge.errors import DocumentTooLarge, EmptyDocument, UnreadableDocument, UnsupportedDocumentType

DEFAULT_MAX_BYTES = 10 * 1024 * 1024  # as KnowledgeOptions.max_file_bytes
EXTENSIONS = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown",
              ".html": "html", ".htm": "html", ".pdf": "pdf"}
CONTENT_TYPES = {"text/plain": "text", "text/markdown": "markdown", "text/x-markdown": "markdown",
                 "text/html": "html", "application/xhtml+xml": "html", "application/pdf": "pdf"}
PDF_MAGIC = b"%PDF-"
PDF_HEADER_WINDOW = 1024  # the PDF spec lets the header start anywhere in the first 1 KiB
_SUPPORTED = ".txt, .md, .html, .pdf"


@dataclass(frozen=True)
class Section:
    heading: str | None  # heading path, outermost first, joined by " > "; None before any heading
    text: str  # blocks, one per line


@dataclass(frozen=True)
class Document:
    source: str  # the uploaded file's name
    kind: str  # "text", "markdown", "html" or "pdf"
    sections: tuple[Section, ...]


def document_kind(filename: str, content_type: str | None) -> str:
    """The kind by extension, else by content type; UnsupportedDocumentType if neither is known."""
    kind = EXTENSIONS.get(PurePath(filename).suffix.lower())
    if kind is None and content_type:
        kind = CONTENT_TYPES.get(content_type.split(";")[0].strip().lower())
    if kind is None:
        raise UnsupportedDocumentType(
            f"{filename}: unsupported document type ({content_type or 'no content type'}); "
            f"upload {_SUPPORTED} files")
    return kind


def parse_document(filename: str, content_type: str | None, data: bytes, *,
                   max_bytes: int = DEFAULT_MAX_BYTES) -> Document:
    """Checks size, then type, then content; raises a KnowledgeError naming the file."""
    if len(data) > max_bytes:
        raise DocumentTooLarge(f"{filename}: {len(data)} bytes is over the {max_bytes}-byte limit; "
                               "split it into smaller files")
    kind = document_kind(filename, content_type)
    if not data.strip():
        raise EmptyDocument(f"{filename}: the file is empty; upload a file with text in it")
    if kind == "pdf":
        sections = [Section(None, _pdf_text(filename, data))]
    elif kind == "html":
        sections = html_sections(_decode_html(filename, content_type, data))
    else:
        text = _decode_utf8(filename, data)
        sections = markdown_sections(text) if kind == "markdown" else [Section(None, "\n".join(paragraph_blocks(text)))]
    sections = [section for section in sections if section.text.strip()]
    if not sections:
        if kind in ("html", "pdf"):
            raise UnreadableDocument(f"{filename}: no readable text found in this {kind.upper()} file; "
                                     + ("a scanned PDF needs OCR first" if kind == "pdf" else
                                        "upload the page's text as .txt or .md"))
        raise EmptyDocument(f"{filename}: the file holds only whitespace or markup; upload a file with text in it")
    return Document(source=filename, kind=kind, sections=tuple(sections))


_LIST_MARKER = re.compile(r"^\s*(?:[-*+\u2022\u2023\u25e6\u25aa]|\d{1,3}[.)])\s+")


def paragraph_blocks(text: str) -> list[str]:
    """Hard-wrapped lines joined into paragraphs; a blank line or a list item starts a block."""
    blocks: list[list[str]] = []
    current: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            current = []
            continue
        marker = _LIST_MARKER.match(line)
        if marker:
            current = [line[marker.end():]]
            blocks.append(current)
        elif current:
            current.append(line)
        else:
            current = [line]
            blocks.append(current)
    return [" ".join(" ".join(block).split()) for block in blocks if "".join(block).strip()]


def _decode_utf8(filename: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8-sig")  # a byte order mark is fine, and dropped
    except UnicodeDecodeError as exc:
        raise UnreadableDocument(f"{filename}: not UTF-8 text (bad byte at offset {exc.start}); "
                                 "save it as UTF-8 and upload again") from None
    if "\x00" in text:
        raise UnreadableDocument(f"{filename}: holds NUL bytes, so it is binary, not UTF-8 text; "
                                 f"upload {_SUPPORTED} files")
    return text


_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_HEADER_CHARSET = re.compile(r"charset\s*=\s*[\"']?([A-Za-z0-9_.:-]+)", re.IGNORECASE)
_META_WINDOW = 4096  # browsers look for the charset <meta> in the first 1024 bytes; be generous


def _decode_html(filename: str, content_type: str | None, data: bytes) -> str:
    """Byte order mark, then the content type's charset, then <meta charset>, else UTF-8."""
    if data.startswith(codecs.BOM_UTF8):
        return _decode_utf8(filename, data)
    declared = _HEADER_CHARSET.search(content_type or "")
    match = declared or _META_CHARSET.search(data[:_META_WINDOW])
    charset = match.group(1) if match else "utf-8"
    charset = charset.decode("ascii") if isinstance(charset, bytes) else charset
    try:
        codecs.lookup(charset)
    except LookupError:
        raise UnreadableDocument(f"{filename}: declares charset {charset!r}, which is unknown; "
                                 "save it as UTF-8 and upload again") from None
    try:
        return data.decode(charset)
    except UnicodeDecodeError as exc:
        raise UnreadableDocument(f"{filename}: not valid {charset} text (bad byte at offset {exc.start}); "
                                 "save it as UTF-8 and upload again") from None


def _pdf_text(filename: str, data: bytes) -> str:
    from pypdf import PdfReader  # imported here: parsing text files must not need it loaded

    if PDF_MAGIC not in data[:PDF_HEADER_WINDOW]:
        raise UnreadableDocument(f"{filename}: named .pdf but is not a PDF (no %PDF- header); "
                                 "upload the real PDF or rename the file to its type")
    try:
        reader = PdfReader(io.BytesIO(data))
        encrypted = reader.is_encrypted
        if not encrypted:
            # A page break does not end a sentence: pages join as lines of one text.
            pages = [page.extract_text() or "" for page in reader.pages]
    except Exception as exc:  # pypdf raises many kinds (PdfReadError, KeyError, ValueError...)
        raise UnreadableDocument(f"{filename}: this PDF cannot be read ({exc.__class__.__name__}); "
                                 "re-save it from a PDF viewer and upload again") from None
    if encrypted:
        raise UnreadableDocument(f"{filename}: the PDF is encrypted; upload an unencrypted copy "
                                 "(print it to a new PDF)")
    return "\n".join(paragraph_blocks("\n".join(pages)))


class _HeadingPath:
    """The open headings, outermost first: a level-2 heading closes every heading of level >= 2."""

    def __init__(self) -> None:
        self._open: list[tuple[int, str]] = []

    def enter(self, level: int, title: str) -> str | None:
        while self._open and self._open[-1][0] >= level:
            self._open.pop()
        if title:
            self._open.append((level, title))
        return " > ".join(t for _, t in self._open) or None


class _SectionBuilder:
    """Blocks under the current heading; a new heading closes the section."""

    def __init__(self) -> None:
        self.sections: list[Section] = []
        self._path = _HeadingPath()
        self._heading: str | None = None
        self._blocks: list[str] = []

    def block(self, text: str) -> None:
        text = " ".join(text.split())
        if text:
            self._blocks.append(text)

    def heading(self, level: int, title: str) -> None:
        self._close()
        self._heading = self._path.enter(level, " ".join(title.split()))

    def finish(self) -> list[Section]:
        self._close()
        return self.sections

    def _close(self) -> None:
        if self._blocks:
            self.sections.append(Section(self._heading, "\n".join(self._blocks)))
        self._blocks = []


# --- Markdown: headings start sections; markup is dropped, its text kept -----------------

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_RULE = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*\S+")
_QUOTE = re.compile(r"^ {0,3}(?:>[ \t]?)+")
_TASK = re.compile(r"^\[[ xX]\]\s+")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|>~<])")
_INLINE = (  # (pattern, replacement), applied in order
    (re.compile(r"<!--.*?-->"), ""),
    (re.compile(r"!\[([^\]]*)\]\([^)]*\)"), r"\1"),  # image -> its alt text
    (re.compile(r"\[([^\]]+)\]\([^)]*\)"), r"\1"),  # link -> its text
    (re.compile(r"\[([^\]]+)\]\[[^\]]*\]"), r"\1"),  # reference link -> its text
    (re.compile(r"<((?:https?://|mailto:)[^>\s]+)>"), r"\1"),  # autolink -> the address
    (re.compile(r"</?[A-Za-z][^>]*>"), ""),  # inline HTML tags
    (re.compile(r"(`+)(.+?)\1"), r"\2"),  # code span
    (re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1"), r"\2"),  # strong
    (re.compile(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])"), r"\1"),  # emphasis *x*
    (re.compile(r"(?<![\w_])_(?=\S)(.+?)(?<=\S)_(?![\w_])"), r"\1"),  # emphasis _x_, not snake_case
    (re.compile(r"~~(?=\S)(.+?)(?<=\S)~~"), r"\1"),  # strikethrough
)


def markdown_inline_text(text: str) -> str:
    """One line of Markdown as plain text: links keep their words, emphasis marks go."""
    escaped: list[str] = []

    def hide(match: re.Match) -> str:  # escaped characters are literal: keep them from the rules
        escaped.append(match.group(1))
        return f"\x00{len(escaped) - 1}\x00"

    text = _ESCAPE.sub(hide, text)
    for pattern, replacement in _INLINE:
        text = pattern.sub(replacement, text)
    return re.sub(r"\x00(\d+)\x00", lambda m: escaped[int(m.group(1))], text)


def markdown_sections(text: str) -> list[Section]:
    builder = _SectionBuilder()
    paragraph: list[str] = []
    in_fence = False

    def end_paragraph() -> None:
        builder.block(markdown_inline_text(" ".join(paragraph)))
        paragraph.clear()

    for line in text.splitlines():
        if _FENCE.match(line):
            end_paragraph()
            in_fence = not in_fence
        elif in_fence:
            builder.block(line)  # code: each line is its own block, kept as written
        elif (atx := _ATX.match(line)) is not None:
            end_paragraph()
            builder.heading(len(atx.group(1)), markdown_inline_text(atx.group(2) or ""))
        elif paragraph and _SETEXT.match(line):
            title = markdown_inline_text(" ".join(paragraph))
            paragraph.clear()
            builder.heading(1 if line.strip()[0] == "=" else 2, title)
        elif not line.strip() or _RULE.match(line) or _REFERENCE.match(line) or _TABLE_RULE.match(line):
            end_paragraph()
        else:
            _markdown_line(_QUOTE.sub("", line), paragraph, builder, end_paragraph)
    end_paragraph()
    return builder.finish()


def _markdown_line(line: str, paragraph: list[str], builder: _SectionBuilder, end_paragraph) -> None:
    if (marker := _LIST_MARKER.match(line)) is not None:
        end_paragraph()
        paragraph.append(_TASK.sub("", line[marker.end():]))
    elif line.count("|") >= 2 or line.strip().startswith("|"):  # a table row: one block, cells apart
        end_paragraph()
        cells = [markdown_inline_text(cell.strip()) for cell in line.strip().strip("|").split("|")]
        builder.block("; ".join(cell for cell in cells if cell))
    else:
        paragraph.append(line)


# --- HTML: h1-h6 start sections; scripts, styles and navigation are dropped --------------

_SKIPPED = frozenset({"script", "style", "nav", "noscript", "template", "svg", "title"})
_BLOCKS = frozenset({"p", "div", "li", "ul", "ol", "br", "tr", "table", "section", "article", "header",
                     "footer", "main", "aside", "blockquote", "pre", "dd", "dt", "dl", "figcaption",
                     "hr", "form", "fieldset", "address", "caption", "details", "summary"})
_HEADINGS = {f"h{level}": level for level in range(1, 7)}


class _HTMLText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.builder = _SectionBuilder()
        self._skipping: list[str] = []  # open skipped elements (they may nest)
        self._text: list[str] = []
        self._heading_level: int | None = None

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in _SKIPPED:
            self._skipping.append(tag)
        elif tag in _HEADINGS:
            self._end_block()
            self._heading_level = _HEADINGS[tag]
        elif tag in _BLOCKS:
            self._end_block()
        elif tag in ("td", "th") and self._text and "".join(self._text).strip():
            self._text.append("; ")

    def handle_startendtag(self, tag: str, attrs) -> None:
        if tag in _BLOCKS:
            self._end_block()

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            if tag in self._skipping:  # close it and anything left open inside it
                del self._skipping[len(self._skipping) - 1 - self._skipping[::-1].index(tag):]
        elif tag in _HEADINGS and self._heading_level is not None:
            self.builder.heading(self._heading_level, "".join(self._text))
            self._text.clear()
            self._heading_level = None
        elif tag in _BLOCKS:
            self._end_block()

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self._text.append(data)

    def _end_block(self) -> None:
        if self._heading_level is None:
            self.builder.block("".join(self._text))
            self._text.clear()

    def sections(self) -> list[Section]:
        self.close()
        self._heading_level = None
        self._end_block()
        return self.builder.finish()


def html_sections(text: str) -> list[Section]:
    parser = _HTMLText()
    parser.feed(text)
    return parser.sections()
