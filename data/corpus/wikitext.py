"""Plain prose from a MediaWiki XML dump: article iteration and markup stripping.

gensim's `wikicorpus` reads the dump (`extract_pages`) and supplies the patterns that strip
markup as well as ours would. The other patterns are ours, each with the measured reason why
gensim's `filter_wiki` would not do: it cleans text for bag-of-words models, so it leaves
formatting that their tokenizer discards later. Templates, tables, references and media are
dropped rather than rendered; link labels, headings and body text are kept.
"""

import bz2
import html
import re
from collections.abc import Iterator
from pathlib import Path

# Whole elements whose content is not prose (citations, image galleries, ...). gensim drops
# <math> (RE_P10, below), but only strips the tags of the others and keeps their content: 1,972
# more training tokens of gallery lines ("File:x.jpg|caption"). Its <ref> pattern (RE_P1) ends
# a reference at the first "/>", so a <br /> inside one leaks the rest (30 tokens, 2 articles).
_DROPPED_ELEMENTS = re.compile(
    r"<(ref|gallery|timeline|score|syntaxhighlight|source|imagemap)\b[^>]*?>.*?</\1\s*>",
    re.DOTALL | re.IGNORECASE,
)
_SELF_CLOSING_REF = re.compile(r"<ref\b[^>]*/\s*>", re.IGNORECASE)
# A tag starts with a letter: gensim's RE_P11 ("<(.*?)>") also deletes prose from a "<" to the
# next ">" ("<10 ppm level" in "Asphalt" to a later tag: 6,614 training tokens).
_TAG = re.compile(r"</?[a-zA-Z][^<>]*>")
_TEMPLATE_BRACES = re.compile(r"\{\{|\}\}")
# Tables are dropped whole: gensim keeps their cells as lines of text ("Fresh asphalt", "0.04",
# ...), 17,180 more training tokens in 34 articles.
_TABLE_BRACES = re.compile(r"^[ \t]*\{\||^[ \t]*\|\}", re.MULTILINE)
# gensim's RE_P5 keeps the space before a label (77 training tokens in 32 articles) and needs a
# scheme, so a protocol-relative [//host label] stays as markup ("Articles of Confederation").
_EXTERNAL_LINK = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]*(?:\s+([^\]]*))?\]", re.IGNORECASE)
# An innermost [[...]]: no "[[" or "]]" inside, single brackets allowed ("[sic]"), and a "]"
# right before the closing "]]" belongs inside ("[[File:x|see [http://a b]]]").
# gensim keeps [[File:...]] captions and then strips every remaining bracket, editorial ones
# too ("uphold[ing]"): 16,842 more training tokens in 83 articles. Its RE_P2 drops
# interlanguage links only at the very end of a page.
_INNER_LINK = re.compile(r"\[\[((?:[^\[\]]|\[(?!\[)|\](?!\])|\](?=\]\]))*)\]\]")
_DROPPED_LINK_PREFIXES = {"file", "image", "media", "category"}
_INTERLANGUAGE = re.compile(r"^[a-z]{2,3}(?:-[a-z]+)*:")
# gensim has no step for these; it would leave '' and ''' (8,925 training tokens), == headings ==
# (3,990), list markers (4,573) and __NOTOC__-style magic words (5).
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
    gensim's remove_template gives the same sample corpus, but it drops all text after an
    unclosed "{{", leaves a stray "}}", and does not handle tables.
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
    # Imported here: importing gensim takes ~5 s, which a run reusing a built corpus never needs.
    from gensim.corpora.wikicorpus import RE_P0, RE_P10  # <!-- comments -->, <math> formulas

    text = RE_P0.sub("", text)
    text = RE_P10.sub("", text)
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


def _is_not_redirect(elem, namespace: str, **_) -> bool:
    return elem.find(f"{{{namespace}}}redirect") is None


def iter_articles(path: str | Path) -> Iterator[tuple[str, str]]:
    """Yield (title, clean text) for each main-namespace, non-redirect page of a .xml.bz2 dump.

    Streams the file and empties each page once read; the emptied elements stay in the parsed
    tree, ~100 bytes a page (20 kB for the sample's 206 pages). Pages whose text is empty after
    cleaning are skipped.
    """
    from gensim.corpora.wikicorpus import extract_pages  # imported here: see clean_wikitext

    with bz2.open(path, "rb") as f:
        # A page filtered out comes back with empty text, which the check below skips.
        pages = extract_pages(f, filter_namespaces=("0",), filter_articles=_is_not_redirect)
        for title, text, _ in pages:
            body = clean_wikitext(text)
            if body:
                yield title.strip(), body
