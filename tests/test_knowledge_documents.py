"""Uploaded files -> sections: each type, each refusal, without a server."""

from __future__ import annotations

import io

import pytest

from knowledge.documents import (Section, document_kind, markdown_inline_text, paragraph_blocks,
                                 parse_document)
from knowledge.errors import (DocumentTooLarge, EmptyDocument, KnowledgeError, UnreadableDocument,
                              UnsupportedDocumentType)


def minimal_pdf(pages: list[list[str]]) -> bytes:
    """A real PDF written by hand: one Helvetica text line per string, one page per list."""
    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    count = len(pages)
    objects = ["<< /Type /Catalog /Pages 2 0 R >>",
               "<< /Type /Pages /Kids [%s] /Count %d >>" % (" ".join(f"{3 + 2 * i} 0 R" for i in range(count)), count)]
    font = 3 + 2 * count
    for i, lines in enumerate(pages):
        stream = "BT /F1 12 Tf 72 720 Td 14 TL " + " ".join(f"({escape(line)}) Tj T*" for line in lines) + " ET"
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
                       f"/Resources << /Font << /F1 {font} 0 R >> >> >>")
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    objects.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n{body}\nendobj\n".encode("latin-1"))
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for offset in offsets:
        out.write(f"{offset:010d} 00000 n \n".encode())
    out.write(f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return out.getvalue()


def test_the_hand_written_pdf_is_one_pypdf_reads():
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(minimal_pdf([["Opening hours (weekdays)"], ["Page two"]])))
    assert len(reader.pages) == 2
    assert "Opening hours (weekdays)" in reader.pages[0].extract_text()


@pytest.mark.parametrize(("filename", "content_type", "kind"), [
    ("notes.txt", None, "text"), ("NOTES.TXT", "application/octet-stream", "text"),
    ("faq.md", None, "markdown"), ("faq.markdown", "text/plain", "markdown"),
    ("page.html", None, "html"), ("page.htm", None, "html"), ("doc.pdf", None, "pdf"),
    ("upload", "text/markdown", "markdown"), ("upload", "text/html; charset=utf-8", "html"),
    ("upload", "application/pdf", "pdf"), ("upload.bin", "text/plain", "text"),
])
def test_kind_comes_from_the_extension_then_the_content_type(filename, content_type, kind):
    assert document_kind(filename, content_type) == kind


@pytest.mark.parametrize(("filename", "content_type"), [
    ("photo.jpg", "image/jpeg"), ("sheet.xlsx", None), ("noext", None), ("archive.zip", "application/zip"),
])
def test_other_types_are_refused_with_415_naming_the_file(filename, content_type):
    with pytest.raises(UnsupportedDocumentType) as caught:
        parse_document(filename, content_type, b"data")
    assert caught.value.http_status == 415
    assert filename in str(caught.value) and ".pdf" in str(caught.value)


def test_size_is_checked_before_anything_else():
    with pytest.raises(DocumentTooLarge) as caught:
        parse_document("huge.exe", None, b"x" * 11, max_bytes=10)  # not even a supported type
    assert caught.value.http_status == 413 and "huge.exe" in str(caught.value)
    assert parse_document("ok.txt", None, b"x" * 10, max_bytes=10).sections[0].text == "x" * 10


@pytest.mark.parametrize(("filename", "data"), [
    ("a.txt", b""), ("a.txt", b"  \n\t\r\n "), ("a.md", b"\n\n"), ("a.txt", b"\xef\xbb\xbf  \n"),
    ("a.md", b"---\n\n***\n"), ("a.html", b"   "), ("a.pdf", b""),
])
def test_empty_or_whitespace_only_files_are_empty_documents(filename, data):
    with pytest.raises(EmptyDocument) as caught:
        parse_document(filename, None, data)
    assert caught.value.http_status == 422 and filename in str(caught.value)


def test_text_keeps_paragraphs_and_joins_wrapped_lines():
    data = "\ufeffWe open at nine.\nWe close at five.\n\n- Parking is free\n* Bring your card\n2) Sign in\n".encode()
    (section,) = parse_document("hours.txt", "text/plain", data).sections
    assert section == Section(None, "We open at nine. We close at five.\nParking is free\nBring your card\nSign in")


@pytest.mark.parametrize("data", [b"caf\xe9 latin-1", b"\xff\xfeh\x00i\x00", b"text\x00with nul"])
def test_text_that_is_not_utf8_is_unreadable(data):
    with pytest.raises(UnreadableDocument) as caught:
        parse_document("menu.txt", None, data)
    assert caught.value.http_status == 422 and "menu.txt" in str(caught.value) and "UTF-8" in str(caught.value)


def test_markdown_headings_start_sections_with_their_path():
    data = b"""Before any heading.

# Clinic
Welcome.

## Opening hours
Mon-Fri 9-5.

### Holidays
Closed.

## Parking
Free.

Pricing
=======
Varies.
"""
    sections = parse_document("clinic.md", None, data).sections
    assert [(s.heading, s.text) for s in sections] == [
        (None, "Before any heading."), ("Clinic", "Welcome."), ("Clinic > Opening hours", "Mon-Fri 9-5."),
        ("Clinic > Opening hours > Holidays", "Closed."), ("Clinic > Parking", "Free."), ("Pricing", "Varies."),
    ]


@pytest.mark.parametrize(("markdown", "plain"), [
    ("**bold** and __strong__", "bold and strong"),
    ("*em* and _em_ but snake_case_name and 2*3*4", "em and em but snake_case_name and 2*3*4"),
    ("see [our site](https://x.example/a) or [the map][1]", "see our site or the map"),
    ("![a photo of the desk](desk.png) here", "a photo of the desk here"),
    ("mail <mailto:desk@x.example> or <https://x.example>", "mail mailto:desk@x.example or https://x.example"),
    ("run `make setup` now", "run make setup now"),
    ("~~old~~ new <b>price</b>", "old new price"),
    (r"\*literal stars\* and \_under\_", "*literal stars* and _under_"),
])
def test_markdown_inline_markup_becomes_plain_text(markdown, plain):
    assert markdown_inline_text(markdown) == plain


def test_markdown_lists_tables_quotes_and_code_stay_separate_blocks():
    data = b"""# Menu
> Quoted **note**.

- [x] Coffee: $3
- Tea: $2
  with milk

| Item | Price |
|:-----|------:|
| Cake | $4 |

```
not # a heading
```
[1]: https://x.example
"""
    (section,) = parse_document("menu.md", None, data).sections
    assert section.heading == "Menu"
    assert section.text.split("\n") == ["Quoted note.", "Coffee: $3", "Tea: $2 with milk", "Item; Price",
                                        "Cake; $4", "not # a heading"]


def test_html_headings_blocks_and_dropped_elements():
    data = b"""<!doctype html><html><head><title>Shop</title><style>p{color:red}</style>
<script>var x = "<p>not text</p>";</script></head><body>
<nav><a href="/">Home</a> | <a href="/about">About</a></nav>
<p>Intro &amp; welcome<br>second line</p>
<h1>Orders</h1><p>We ship <em>daily</em>.</p>
<h2>Returns</h2><ul><li>Within 30 days</li><li>With a receipt</li></ul>
<table><tr><th>Size</th><th>Fee</th></tr><tr><td>Small</td><td>$5</td></tr></table>
<h2>Contact</h2><div>Call us<noscript>enable JS</noscript>.</div>
</body></html>"""
    sections = parse_document("shop.html", "text/html", data).sections
    assert [(s.heading, s.text) for s in sections] == [
        (None, "Intro & welcome\nsecond line"),
        ("Orders", "We ship daily."),
        ("Orders > Returns", "Within 30 days\nWith a receipt\nSize; Fee\nSmall; $5"),
        ("Orders > Contact", "Call us."),
    ]


@pytest.mark.parametrize(("data", "content_type"), [
    ('<meta charset="windows-1252"><p>Caf\xe9 cr\xe8me</p>'.encode("cp1252"), "text/html"),
    ('<meta http-equiv="Content-Type" content="text/html; charset=ISO-8859-1"><p>Caf\xe9 cr\xe8me</p>'
     .encode("latin-1"), None),
    ('<p>Caf\xe9 cr\xe8me</p>'.encode("latin-1"), "text/html; charset=latin-1"),
    ('\ufeff<meta charset="latin-1"><p>Caf\xe9 cr\xe8me</p>'.encode("utf-8"), None),  # the BOM wins
    ('<p>Caf\xe9 cr\xe8me</p>'.encode("utf-8"), None),
])
def test_html_charset_from_bom_header_or_meta(data, content_type):
    (section,) = parse_document("page.html", content_type, data).sections
    assert section.text == "Caf\xe9 cr\xe8me"


@pytest.mark.parametrize("data", [
    b"<html><body><script>only()</script><nav>menu</nav></body></html>",
    b"<div><img src=x.png></div>",
    '<meta charset="klingon-8"><p>hi</p>'.encode(),
    b"<p>caf\xe9 without a charset</p>",
])
def test_html_without_readable_text_is_unreadable(data):
    with pytest.raises(UnreadableDocument) as caught:
        parse_document("page.html", None, data)
    assert "page.html" in str(caught.value)


def test_pdf_text_is_extracted_across_pages():
    data = minimal_pdf([["Dr. Lee sees patients on Mondays.", "The clinic opens at 9:30."],
                        ["Parking is behind the building."]])
    document = parse_document("clinic.pdf", "application/pdf", data)
    assert document.kind == "pdf"
    (section,) = document.sections
    assert section.heading is None
    assert "Dr. Lee sees patients on Mondays." in section.text
    assert "Parking is behind the building." in section.text


@pytest.mark.parametrize(("data", "says"), [
    (b"this is just text named .pdf", "not a PDF"),
    (b"%PDF-1.4\n garbage that is not a pdf body", "cannot be read"),
    (minimal_pdf([[]]), "no readable text"),
])
def test_bad_pdfs_are_unreadable(data, says):
    with pytest.raises(UnreadableDocument) as caught:
        parse_document("scan.pdf", None, data)
    assert "scan.pdf" in str(caught.value) and says in str(caught.value)


def test_an_encrypted_pdf_is_refused():
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(minimal_pdf([["secret hours"]]))))
    writer.encrypt("owner-and-user", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    with pytest.raises(UnreadableDocument, match="encrypted"):
        parse_document("locked.pdf", None, out.getvalue())


def test_paragraph_blocks_drop_blank_lines_and_markers():
    assert paragraph_blocks("a\nb\n\n\n- c\n  d\n1. e") == ["a b", "c d", "e"]
    assert paragraph_blocks("   \n\n") == []


def test_every_refusal_is_a_knowledge_error_with_a_status():
    for data, filename in ((b"", "a.txt"), (b"\xff", "a.txt"), (b"x", "a.jpg")):
        with pytest.raises(KnowledgeError) as caught:
            parse_document(filename, None, data)
        assert caught.value.http_status in (415, 422) and not caught.value.retryable
