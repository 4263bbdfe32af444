"""Make the library's CJK web font, ``attnviz/assets/fonts/attnviz-cjk.woff2`` (family "attnviz CJK").

A subset of Noto Sans CJK SC Regular (SIL Open Font License 1.1, ``OFL.txt`` beside the font) from
Debian's ``fonts-noto-cjk``: the 6,763 hanzi of GB2312 (its 3,755 common characters of level 1 and
the 3,008 of level 2: simplified Chinese as it is written day to day), CJK symbols and punctuation
(U+3000–303F), hiragana and katakana (U+3040–30FF) and the half- and full-width forms (U+FF00–FFEF),
nothing else — Latin comes from the page's own fonts. 1.37 MB as woff2 (7,241 characters). The
family is renamed (the OFL reserves the original name for the unmodified font); the copyright and
licence records are kept.

Needs fontTools and brotli (``pip install fonttools brotli``) and the collection, which need not be
installed system-wide::

    apt-get download fonts-noto-cjk && dpkg-deb -x fonts-noto-cjk_*.deb /tmp/noto
    python scripts/make_cjk_font.py --source /tmp/noto/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc

The output is byte-for-byte the same for the same source and fontTools (the source's timestamps kept).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fontTools import subset
from fontTools.ttLib import TTCollection, TTFont

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "attnviz" / "assets" / "fonts" / "attnviz-cjk.woff2"
SOURCE = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
FACE = "Noto Sans CJK SC"
FAMILY = "attnviz CJK"
POSTSCRIPT = "attnvizCJK-Regular"
RANGES = [(0x3000, 0x303F), (0x3040, 0x30FF), (0xFF00, 0xFFEF)]  # also fonts.css's unicode-range, with 4E00–9FFF


def gb2312_hanzi() -> list[str]:
    """GB2312's 6,763 hanzi: level 1 (3,755 common characters, rows 16–55, bytes 0xB0–0xD7) and level 2
    (3,008, rows 56–87, 0xD8–0xF7), 94 cells a row, row 55 holding 89."""
    chars = []
    for high in range(0xB0, 0xF8):
        for low in range(0xA1, 0xFF):
            try:
                chars.append(bytes([high, low]).decode("gb2312"))
            except UnicodeDecodeError:  # the five empty cells at the end of row 55
                continue
    return chars


def characters() -> str:
    return "".join(gb2312_hanzi() + [chr(c) for a, b in RANGES for c in range(a, b + 1)])


def face(source: Path) -> TTFont:
    if source.suffix.lower() == ".ttc":
        for font in TTCollection(str(source)).fonts:
            if font["name"].getDebugName(1) == FACE:
                return font
        raise SystemExit(f"{source} holds no face named {FACE!r}")
    return TTFont(str(source))


def rename(font: TTFont) -> None:
    names = font["name"]
    names.names = [n for n in names.names if n.nameID in (0, 2, 7, 8, 9, 10, 11, 12, 13, 14)]
    for name_id, value in {1: FAMILY, 3: f"{POSTSCRIPT};subset of {FACE} 2.004", 4: FAMILY, 6: POSTSCRIPT}.items():
        names.setName(value, name_id, 3, 1, 0x409)
    if "CFF " in font:
        cff = font["CFF "].cff
        cff.fontNames = [POSTSCRIPT]
        top = cff.topDictIndex[0]
        top.FullName = top.FamilyName = FAMILY


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=SOURCE, help=f"the Noto Sans CJK collection (default {SOURCE})")
    parser.add_argument("-o", "--out", type=Path, default=OUT, help=f"the woff2 written (default {OUT})")
    args = parser.parse_args(argv)
    if not args.source.is_file():
        print(f"no font at {args.source}: see this script's docstring for where to get it", file=sys.stderr)
        return 1
    font = face(args.source)
    font.recalcTimestamp = False  # the source's dates, so the same source makes the same bytes
    options = subset.Options()
    options.flavor = "woff2"
    options.name_IDs = ["*"]  # every English record (copyright, licence, URLs); rename() drops the family's
    options.layout_features = ["kern"]  # horizontal text in one locale: no locl/vert variants (half the glyphs)
    options.drop_tables += ["vhea", "vmtx", "VORG", "BASE"]  # no vertical writing
    subsetter = subset.Subsetter(options)
    text = characters()
    subsetter.populate(text=text)
    subsetter.subset(font)
    rename(font)
    font.flavor = "woff2"
    font.save(str(args.out))
    covered = sum(1 for ch in text if ord(ch) in font.getBestCmap())
    print(
        f"{args.out}: {args.out.stat().st_size / 1e6:.2f} MB, {covered} characters ({len(font.getGlyphOrder())} glyphs)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
