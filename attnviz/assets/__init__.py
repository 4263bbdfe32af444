"""Files the library ships beside its code: the CJK web face "attnviz CJK" (``fonts/attnviz-cjk.woff2``, a
subset of Noto Sans CJK SC under the SIL OFL 1.1, ``fonts/OFL.txt``; made by ``scripts/make_cjk_font.py``).

The one copy: :func:`attnviz.views.html.cjk_font_face` inlines it into exported pages, the kaleido export
hands it to fontconfig, and the dashboard serves this folder at ``assets/fonts/`` for its ``fonts.css``.
Importing this module imports nothing."""

from __future__ import annotations

from pathlib import Path

__all__ = ["CJK_FONT", "FONTS"]

#: the folder of the fonts the library ships (the dashboard serves it as its ``assets/fonts/``)
FONTS = Path(__file__).parent / "fonts"
#: "attnviz CJK": the 6,763 hanzi of GB2312, CJK punctuation, kana and full-width forms, as woff2
CJK_FONT = FONTS / "attnviz-cjk.woff2"
