"""The support sweep's section of the docs: its counts and lists as markdown, written between two marks.

:func:`markdown` makes the section from the sweep's outcomes (:class:`attnviz.testing.sweep.Outcome`, never
typed in); :func:`write` puts it between the two :data:`MARK` lines of :data:`PAGE`, the support table's page
(``python -m attnviz.testing.sweep --write`` runs the sweep and both).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from ..files import write_text
from .sweep import EXACT, Outcome

__all__ = ["MARK", "PAGE", "REASON_CHARS", "markdown", "write"]


def _by_type(outcomes: Iterable[Outcome], *, error: bool = False) -> list[str]:
    """One entry per model type: its backends (with their errors, or each backend's reason)."""
    grouped: dict[str, list[Outcome]] = {}
    for o in outcomes:
        grouped.setdefault(o.family, []).append(o)
    if error:  # an outcome without a number (refused, or failed before comparing) names its kind instead
        return [
            f"{t} ({', '.join(f'{o.backend} {o.error:.0e}' if o.error is not None else f'{o.backend} {o.kind}' for o in os_)})"
            for t, os_ in grouped.items()
        ]
    entries = []
    for t, os_ in grouped.items():
        reasons: dict[str, list[str]] = {}
        for o in os_:
            reason = o.reason.replace(_UNREPRODUCED, "")[:REASON_CHARS]
            reasons.setdefault(reason.replace("<", "&lt;").replace(">", "&gt;"), []).append(o.backend)  # no HTML
        entries += [f"{t} ({' and '.join(backends)}): {r}" for r, backends in reasons.items()]
    return entries


#: the words of a ValidationError before its report (the report is what says which layer and head)
_UNREPRODUCED = "attnviz could not reproduce what the model computed (text 0), so it will not show these maps: "


#: how much of a reason the docs show (the sweep prints it whole)
REASON_CHARS = 160


def markdown(
    claims: Sequence[Outcome],
    seen: Sequence[Outcome],
    others: Sequence[Outcome],
    not_text: Sequence[str],
    two: Sequence[Outcome] = (),
) -> str:
    """The docs' sweep section: the versions it ran on, counts, then the lists (made from the outcomes, never typed)."""
    by = {k: [o for o in others if o.kind == k] for k in ("exact", "refused", "mismatch", "not buildable")}
    exact_claims = [o for o in claims if o.kind == "exact"]
    types = sorted({o.family for o in others})
    exact_types = sorted({o.family for o in by["exact"]} - {o.family for o in others if o.kind != "exact"})
    not_exact = "; ".join(f"{o.family} ({o.backend}): {o.reason}" for o in claims if o.kind != "exact")
    import torch
    import transformers

    lines = [
        f"Measured with transformers {transformers.__version__} and torch {torch.__version__} "
        "(each release of transformers may change the lists below).",
        "",
        f"**The claimed families:** {len(exact_claims)} of {len(claims)} family × backend pairs exact "
        f"(≤ {EXACT:.0e}; largest error {max((o.error or 0.0) for o in claims):.1e})"
        + (f"; not exact: {not_exact}" if not_exact else "")
        + ".",
        "",
        f"**The vision encoders** (a batch of two pictures through each one's image processor): "
        f"{sum(o.kind == 'exact' for o in seen)} of {len(seen)} family × backend pairs exact "
        f"(largest error {max((o.error or 0.0) for o in seen):.1e})"
        + "".join(f"; {o.family} ({o.backend}) {o.kind}: {o.reason}" for o in seen if o.kind != "exact")
        + ": "
        + ", ".join(_by_type(seen, error=True))
        + ".",
        "",
    ]
    if two:
        lines += [
            "**The models of two towers** (two padded texts with two pictures; each part — a joint model's text "
            "and vision towers, a VLM's language model and vision tower — against the model's own): "
            f"{sum(o.kind == 'exact' for o in two)} of {len(two)} family × backend pairs exact "
            f"(largest error {max((o.error or 0.0) for o in two):.1e})"
            + "".join(f"; {o.family} ({o.backend}) {o.kind}: {o.reason}" for o in two if o.kind != "exact")
            + ": "
            + ", ".join(_by_type(two, error=True))
            + ".",
            "",
        ]
    lines += [
        f"**Every other text model type of transformers** ({len(types)} swept, tiny, from `CONFIG_MAPPING` "
        f"by their generic config fields; {len(not_text)} model types without a causal-LM, seq2seq-LM or "
        "masked-LM class are not tested here): "
        f"{len(by['exact'])} family × backend pairs exact ({len(exact_types)} model types on every backend), "
        f"{len(by['refused'])} refused, {len(by['mismatch'])} mismatch, {len(by['not buildable'])} not buildable "
        "tiny. These are measured, not claimed: only the table above is.",
    ]
    titles = {
        "exact": "exact, by model type (each backend's largest error)",
        "refused": "refused by attnviz, and why",
        "mismatch": "mismatch (not claimed: open problems; a ValidationError is attnviz's self-check refusing the maps)",
        "not buildable": "not buildable tiny, and why",
    }
    for kind, title in titles.items():
        if by[kind]:
            entries = _by_type(by[kind], error=kind == "exact")
            lines += ["", f"<details><summary>{len(entries)} {title}</summary>", ""]
            lines += [f"- {e}" for e in entries] + ["", "</details>"]
    return "\n".join(lines)


MARK = "<!-- attnviz:sweep -->"
#: the page whose section ``--write`` fills, relative to the repository's root (the support table's page)
PAGE = Path("docs") / "guides" / "capture.md"


def write(section: str, paths: Iterable[Path]) -> None:
    """Put ``section`` between the two :data:`MARK` lines of each file."""
    for path in paths:
        text = path.read_text()
        head, sep, rest = text.partition(MARK)
        _, sep2, tail = rest.partition(MARK)
        if not (sep and sep2):
            raise SystemExit(f"{path}: expected two {MARK} lines around the sweep's section")
        write_text(path, f"{head}{MARK}\n{section}\n{MARK}{tail}")
