"""Plain prose from a MediaWiki XML dump: article iteration and markup stripping.

Only the standard library: the dump is small and the markup rules needed for clean training
text are few. Templates, tables, references and media are dropped rather than rendered; link
labels, headings and body text are kept.
"""

import bz2
import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

# Whole elements whose content is not prose (citations, formulas, image galleries, ...).
_DROPPED_ELEMENTS = re.compile(
    r"<(ref|math|gallery|timeline|score|syntaxhighlight|source|imagemap)\b[^>]*?>.*?</\1\s*>",
    re.DOTALL | re.IGNORECASE,
)
_SELF_CLOSING_REF = re.compile(r"<ref\b[^>]*/\s*>", re.IGNORECASE)
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
_TAG = re.compile(r"</?[a-zA-Z][^<>]*>")
_TEMPLATE_BRACES = re.compile(r"\{\{|\}\}")
_TABLE_BRACES = re.compile(r"^[ \t]*\{\||^[ \t]*\|\}", re.MULTILINE)
_EXTERNAL_LINK = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]*(?:\s+([^\]]*))?\]", re.IGNORECASE)
# An innermost [[...]]: no "[[" or "]]" inside, single brackets allowed ("[sic]"), and a "]"
# right before the closing "]]" belongs inside ("[[File:x|see [http://a b]]]").
_INNER_LINK = re.compile(r"\[\[((?:[^\[\]]|\[(?!\[)|\](?!\])|\](?=\]\]))*)\]\]")
_DROPPED_LINK_PREFIXES = {"file", "image", "media", "category"}
_INTERLANGUAGE = re.compile(r"^[a-z]{2,3}(?:-[a-z]+)*:")
_BOLD_ITALIC = re.compile(r"'{2,}")
_HEADING = re.compile(r"^(=+)[ \t]*(.*?)[ \t]*\1[ \t]*$", re.MULTILINE)
_LIST_MARKERS = re.compile(r"^[*#:;]+[ \t]*", re.MULTILINE)
_MAGIC_WORDS = re.compile(r"__[A-Z]+__|^-{4,}[ \t]*$", re.MULTILINE)
_TRAILING_SPACE = re.compile(r"[ \t]+$", re.MULTILINE)
_BLANK_LINES = re.compile(r"\n{3,}")


def _remove_nested(text: str, braces: re.Pattern[str]) -> str:
    """Remove balanced spans whose delimiters `braces` matches (openers start with "{").

    Templates nest ({{a|{{b}}}}), which regexes cannot balance; a depth count can. An opener
    that is never closed, or a stray closer, is dropped on its own so no delimiter survives.
    """
    pieces, depth, kept_from, span_start = [], 0, 0, 0
    for match in braces.finditer(text):
        if match.group().lstrip().startswith("{"):
            if depth == 0:
                span_start = match.start()
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                pieces.append(text[kept_from:span_start])
                kept_from = match.end()
        else:  # stray closer outside any span
            pieces.append(text[kept_from : match.start()])
            kept_from = match.end()
    if depth > 0:  # unclosed: keep the text after the opener, drop the opener itself
        pieces.append(text[kept_from:span_start])
        return "".join(pieces) + braces.sub("", text[span_start:])
    pieces.append(text[kept_from:])
    return "".join(pieces)


def _link_text(match: re.Match[str]) -> str:
    """What a reader sees of [[target|label]]: the label, the target, or nothing for media."""
    target, _, label = match.group(1).partition("|")
    target = target.strip()
    prefix = target.split(":", 1)[0].strip().lower() if ":" in target else ""
    if prefix in _DROPPED_LINK_PREFIXES or _INTERLANGUAGE.match(target):
        return ""
    return (label or target).strip().lstrip(":")


def clean_wikitext(text: str) -> str:
    """Strip MediaWiki markup from an article's source, leaving plain prose."""
    text = _COMMENT.sub("", text)
    text = _SELF_CLOSING_REF.sub("", text)
    text = _DROPPED_ELEMENTS.sub("", text)
    text = _remove_nested(text, _TEMPLATE_BRACES)
    text = _remove_nested(text, _TABLE_BRACES)
    # Innermost links first, so captions holding links resolve before their [[File:...]].
    while True:
        text, n = _INNER_LINK.subn(_link_text, text)
        if n == 0:
            break
    text = text.replace("[[", "").replace("]]", "")  # leftovers of unbalanced links
    # After internal links, so an external link's label may have held one.
    text = _EXTERNAL_LINK.sub(lambda m: m.group(1) or "", text)
    text = _TAG.sub("", text)
    text = _BOLD_ITALIC.sub("", text)
    text = _HEADING.sub(r"\2", text)
    text = _LIST_MARKERS.sub("", text)
    text = _MAGIC_WORDS.sub("", text)
    text = html.unescape(text).replace("\xa0", " ")
    text = _TRAILING_SPACE.sub("", text)
    return _BLANK_LINES.sub("\n\n", text).strip()


def iter_articles(path: str | Path) -> Iterator[tuple[str, str]]:
    """Yield (title, clean text) for each main-namespace, non-redirect page of a .xml.bz2 dump.

    Streams the file and clears each page once read, so memory stays flat for any dump size.
    Pages whose text is empty after cleaning are skipped.
    """
    with bz2.open(path, "rb") as f:
        events = ET.iterparse(f, events=("start", "end"))
        _, root = next(events)
        ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
        for event, elem in events:
            if event != "end" or elem.tag != f"{ns}page":
                continue
            is_article = elem.findtext(f"{ns}ns") == "0" and elem.find(f"{ns}redirect") is None
            if is_article:
                title = elem.findtext(f"{ns}title", "").strip()
                body = clean_wikitext(elem.findtext(f"{ns}revision/{ns}text", ""))
                if body:
                    yield title, body
            root.clear()  # drop the page just read (and any earlier siblings)
