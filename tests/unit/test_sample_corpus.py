"""The embedded sample corpus: markup stripping, the built shards, and the build cache."""

import bz2
import os
from xml.sax.saxutils import escape, quoteattr

import pytest

from data.corpus import sample
from data.corpus.sample import build_sample_corpus, corpus_dir
from data.corpus.split import is_val
from data.corpus.wikitext import clean_wikitext, iter_articles
from data.token_shards import CorpusFiles, load_shard, read_header
from data.tokenizer import EOT, gpt2_encoding

# ---- clean_wikitext -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wikitext", "plain"),
    [
        ("A{{cite|x={{b|c={{d}}}}|e}} B.", "A B."),
        (
            'Fact.<ref name="a">{{cite web|url=x}} [[Foo]]</ref> More.<ref name="a" /> '
            "End<ref>plain</ref>.",
            "Fact. More. End.",
        ),
        (
            "[[File:Map.png|thumb|200px|A map of [[France|French]] [[Paris]] "
            "[http://x.org a site]]]Text [[Image:B.jpg|left|[[a|b]] c]]after",
            "Text after",
        ),
        ("[[political philosophy|politics]] and [[Paris]]s", "politics and Pariss"),
        (
            "[http://example.com Example site], [https://x.org] and [//y.org Y]",
            "Example site,  and Y",
        ),
        ("[http://a.org talk at [[University of X|X U]], 1962]", "talk at X U, 1962"),
        (
            "'''Bold''' and ''italic'' and '''''both''''' and it's",
            "Bold and italic and both and it's",
        ),
        ("== History ==\nText\n=== Early years===\nMore", "History\nText\nEarly years\nMore"),
        ('Before\n{| class="wikitable"\n|-\n| a || {{x}}\n|}\nAfter', "Before\n\nAfter"),
        ("Before\n{|\n| outer\n{|\n| inner\n|}\n| outer\n|}\nAfter", "Before\n\nAfter"),
        ("Text\n[[Category:Foo| ]]\n[[fr:Anarchisme]]\n[[:Category:Bar]]", "Text\n\nCategory:Bar"),
        (
            "a<!-- hidden [[x]] -->b<br/>c&nbsp;d &amp; e<sup>2</sup> <math>x^2</math>.",
            "abc d & e2 .",
        ),
        ("* one\n# two\n: three\n----\n__NOTOC__", "one\ntwo\nthree"),
        ("p1\n\n\n\n\np2  \n", "p1\n\np2"),
        ("a {{unclosed b", "a unclosed b"),
        ("x }} y ]] z", "x  y  z"),
    ],
)
def test_clean_wikitext(wikitext, plain):
    assert clean_wikitext(wikitext) == plain


# ---- iter_articles on a hand-written dump (gensim's extract_pages and patterns) ---------------

_ADA = """{{Infobox person|name=Ada|born={{birth date|1815|12|10}}}}
'''Ada Lovelace''' was an English [[mathematician]].<!-- see the
talk page --> She wrote about the [[Analytical Engine|engine]]<ref>{{cite book|title=X}}</ref>
and its numbers<math display="inline">B_n</math>.

== Life ==
[[File:Ada.jpg|thumb|Portrait of [[Ada Lovelace|Ada]]]]
She was born in [[London]].

[[Category:Mathematicians]]"""


def _write_dump(path, pages: list[tuple[str, str, str, str | None]]) -> None:
    """A .xml.bz2 dump in the MediaWiki export format of (title, ns, text, redirect target)."""
    xml = [
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" xml:lang="en">',
        "<siteinfo><sitename>Wikipedia</sitename></siteinfo>",
    ]
    for page_id, (title, ns, text, target) in enumerate(pages):
        xml.append(
            f"<page><title>{escape(title)}</title><ns>{ns}</ns><id>{page_id}</id>"
            + (f"<redirect title={quoteattr(target)} />" if target else "")
            + f'<revision><id>1</id><text xml:space="preserve">{escape(text)}</text>'
            "</revision></page>"
        )
    path.write_bytes(bz2.compress("\n".join([*xml, "</mediawiki>"]).encode()))


def test_iter_articles_yields_clean_main_namespace_articles(tmp_path):
    dump = tmp_path / "dump.xml.bz2"
    _write_dump(
        dump,
        [
            ("Ada Lovelace", "0", _ADA, None),
            ("Lovelace", "0", "#REDIRECT [[Ada Lovelace]]", "Ada Lovelace"),
            ("Wikipedia:About", "4", "A page about the project.", None),
            ("Stub", "0", "{{Only a template}}", None),
            ("Charles Babbage", "0", "'''Babbage''' designed the [[Analytical Engine]].", None),
        ],
    )
    assert list(iter_articles(dump)) == [
        (
            "Ada Lovelace",
            "Ada Lovelace was an English mathematician. She wrote about the engine\n"
            "and its numbers.\n\nLife\n\nShe was born in London.",
        ),
        ("Charles Babbage", "Babbage designed the Analytical Engine."),
    ]


# ---- the real corpus, built once --------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> CorpusFiles:
    return build_sample_corpus(tmp_path_factory.mktemp("cache"), val_fraction=0.1, progress=False)


def test_corpus_shards(corpus):
    assert [p.name for p in corpus.train] == ["train_000000.bin"]
    assert [p.name for p in corpus.val] == ["val_000000.bin"]
    assert corpus.train[0].parent.name == "sample-v1-val0.1"
    train, val = load_shard(corpus.train[0]), load_shard(corpus.val[0])
    assert train[0] == EOT and val[0] == EOT
    assert 400_000 < len(train) + len(val) < 1_500_000
    assert 0.02 < len(val) / (len(train) + len(val)) < 0.3
    assert train.max() < EOT + 1


def test_corpus_split_follows_the_documented_rule(corpus):
    n_train = int((load_shard(corpus.train[0]) == EOT).sum())
    n_val = int((load_shard(corpus.val[0]) == EOT).sum())
    assert n_train + n_val > 90  # the dump holds ~100 articles
    assert n_val == sum(is_val(i, 0.1) for i in range(n_train + n_val))


def test_corpus_text_is_clean_prose(corpus):
    enc = gpt2_encoding()
    for path in corpus.train + corpus.val:
        text = enc.decode(load_shard(path).tolist())
        for markup in ("[[", "]]", "{{", "}}", "<ref", "{|", "<!--"):
            assert markup not in text, (path.name, markup)
    first_document = enc.decode(load_shard(corpus.train[0])[1:40].tolist())
    assert first_document.startswith("Anarchism\n\nAnarchism is a political philosophy")


def test_second_call_uses_the_cache(corpus, monkeypatch):
    cache_dir = corpus.train[0].parent.parent
    mtimes = [p.stat().st_mtime_ns for p in corpus.train + corpus.val]

    def no_rebuild(*args):
        raise AssertionError("rebuilt a valid cache")

    monkeypatch.setattr(sample, "_tokenize", no_rebuild)
    assert build_sample_corpus(cache_dir, val_fraction=0.1, progress=False) == corpus
    assert [p.stat().st_mtime_ns for p in corpus.train + corpus.val] == mtimes


# ---- the build cache, on a few fake articles (fast) --------------------------------------------


@pytest.fixture
def fake_articles(monkeypatch):
    articles = [(f"Title {i}", f"Body of article number {i}.") for i in range(20)]
    monkeypatch.setattr(sample, "iter_articles", lambda path: iter(articles))
    return articles


def _tokens(files: CorpusFiles) -> list[list[int]]:
    return [load_shard(p).tolist() for p in files.train + files.val]


def test_split_of_fake_articles(tmp_path, fake_articles):
    files = build_sample_corpus(tmp_path, val_fraction=0.25, progress=False)
    enc = gpt2_encoding()
    val_text = enc.decode(load_shard(files.val[0]).tolist())
    # (i + 1) * 0.25 crosses an integer at i = 3, 7, 11, 15, 19.
    assert val_text.count("Title") == 5
    assert "Title 3\n\nBody of article number 3." in val_text
    assert "Title 0\n" not in val_text
    assert files.val[0].parent == corpus_dir(tmp_path, 0.25)


def test_interrupted_build_leaves_nothing_and_retries(tmp_path, fake_articles, monkeypatch):
    calls = []

    def write_then_fail(path, tokens):
        calls.append(path)
        if len(calls) == 2:  # after the train shard, before the val shard
            raise KeyboardInterrupt
        real_write(path, tokens)

    real_write = sample.write_shard
    monkeypatch.setattr(sample, "write_shard", write_then_fail)
    with pytest.raises(KeyboardInterrupt):
        build_sample_corpus(tmp_path, progress=False)
    assert os.listdir(tmp_path) == []

    monkeypatch.setattr(sample, "write_shard", real_write)
    files = build_sample_corpus(tmp_path, progress=False)
    assert sorted(os.listdir(tmp_path)) == [corpus_dir(tmp_path, 0.1).name]
    assert all(read_header(p) > 0 for p in files.train + files.val)


def test_stale_temp_dir_does_not_break_the_build(tmp_path, fake_articles):
    stale = corpus_dir(tmp_path, 0.1).with_name(f"sample-v1-val0.1.tmp-{os.getpid()}")
    stale.mkdir()
    (stale / "train_000000.bin").write_bytes(b"half written")
    files = build_sample_corpus(tmp_path, progress=False)
    assert not stale.exists()
    assert all(read_header(p) > 0 for p in files.train + files.val)


def test_corrupt_cache_is_rebuilt(tmp_path, fake_articles):
    files = build_sample_corpus(tmp_path, progress=False)
    expected = _tokens(files)
    data = files.val[0].read_bytes()
    files.val[0].write_bytes(data[:-2])  # truncated
    assert build_sample_corpus(tmp_path, progress=False) == files
    assert _tokens(files) == expected


def test_another_process_finishing_first_is_fine(tmp_path, fake_articles, monkeypatch):
    def other_process_won(src, dst):
        # Another rank renamed its (equivalent) build into place just before us.
        os.replace(src, dst)
        raise OSError("Directory not empty")

    monkeypatch.setattr(sample.os, "rename", other_process_won)
    files = build_sample_corpus(tmp_path, progress=False)
    assert all(read_header(p) > 0 for p in files.train + files.val)
    assert sorted(os.listdir(tmp_path)) == [corpus_dir(tmp_path, 0.1).name]


def test_val_fraction_is_part_of_the_cache_key(tmp_path, fake_articles):
    a = build_sample_corpus(tmp_path, val_fraction=0.1, progress=False)
    b = build_sample_corpus(tmp_path, val_fraction=0.5, progress=False)
    assert a.val[0].parent != b.val[0].parent
    assert len(load_shard(b.val[0])) > len(load_shard(a.val[0]))


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1])
def test_bad_val_fraction(tmp_path, fraction):
    with pytest.raises(ValueError, match=r"data\.val_fraction"):
        build_sample_corpus(tmp_path, val_fraction=fraction, progress=False)


def test_val_fraction_too_small_for_the_documents(tmp_path, fake_articles):
    with pytest.raises(ValueError, match=r"data\.val_fraction=0\.01"):
        build_sample_corpus(tmp_path, val_fraction=0.01, progress=False)
    assert os.listdir(tmp_path) == []


def test_missing_gensim_names_the_install_command(monkeypatch):
    monkeypatch.setattr(sample.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install gensim"):
        sample.sample_dump_path()
