"""The subcommands on one text: ``capture``, ``generate``, ``validate``, ``coref``, ``explain``, ``export``,
``report`` (a capture as one offline HTML page) and ``info`` (a saved capture's provenance); each takes its parsed
arguments and returns the exit status."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import InputError, OutOfRangeError
from .options import check_capture_out, check_part, check_writable, loading_kwargs, names
from .preflight import preflight
from .runs import loading_bars, shown, written_as_csv

ENCODER_DECODER = ("encoder", "decoder", "cross")  # the attentions of --part that capture and export read


def _capture(args, check: str | None = None):
    """The capture a command asked for; ``check``: the command's own (validate: every row), else ``--check``."""
    from .. import (
        capture,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    with loading_bars(args):
        return capture(
            args.model,
            args.text,
            max_length=args.max_length,
            **loading_kwargs(args),
            add_bos=getattr(args, "add_bos", False),
            target=args.target,
            check=check or args.check,
            keep=getattr(args, "keep", None),
            heads=getattr(args, "heads", None),
        )


def cmd_capture(args) -> int:
    """``attnviz capture``: capture a text (saved with ``-o``), and with ``--query`` print where a word's attention goes."""
    check_part(args, "capture --query", ENCODER_DECODER)
    if args.query is None:
        given = [f"--{name}" for name in ("layer", "part") if getattr(args, name) is not None]
        if given:
            raise InputError(
                f"{' and '.join(given)} choose{'s' if len(given) == 1 else ''} what --query prints: add --query WORD "
                "(to capture only some layers, use --layers)"
            )
    if args.out:
        check_capture_out(args.out)
    if args.keep is not None:
        from ..models import check_keep  # deferred, as the runner: torch loads after the checks

        check_keep(args.keep, "--keep")
    preflight(args, args.text, layer=args.layer, query=args.query, part=args.part or "encoder")
    cap = _capture(args)
    print(shown(cap))
    print("words:", " | ".join(map(shown, cap.word_labels)))
    if cap.target is not None:
        print("target words:", " | ".join(map(shown, cap.target.word_labels)))
    if args.query is not None:
        part = cap.resolve_part(args.part) if args.part or len(cap.parts) == 1 else "encoder"
        layer = args.layer if args.layer is not None else min(cap.layer_indices(part))
        queries, keys = cap.sequences(part)
        if part in ("decoder", "cross") and args.query not in queries.word_labels:
            raise InputError(
                f"no word {args.query!r} in the target {queries.word_labels}: {part} attention's queries "
                "are the decoder's tokens, so give the target text with --target"
            )
        q = queries.word_index(args.query)
        weights = cap.attention(layer, part=part, words=True)[:, q]  # [head, word]
        where = f" ({part})" if len(cap.parts) > 1 else ""
        print(f"attention from {queries.words[q].text!r} in layer {layer}{where}, per head (word level, top 3):")
        for i, head in enumerate(cap.layer(layer, part).head_numbers):  # the model's numbers (--heads keeps some)
            top = weights[i].topk(min(3, weights.shape[-1]))
            pairs = ", ".join(
                f"{shown(keys.words[i].text)}={v:.2f}" for v, i in zip(top.values.tolist(), top.indices.tolist())
            )
            print(f"  H{head}: {pairs}")
    if args.out:
        path = cap.save(args.out)  # written whole or not at all; a full disk is one error
        print(f"saved to {shown(path)}")
    return 0


def cmd_generate(args) -> int:
    """``attnviz generate``: let the model write and record every step's attention."""
    from .. import (
        generate,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    if args.out:
        check_capture_out(args.out)
    sampling = {}
    if args.sample:
        sampling = {"do_sample": True, "temperature": args.temperature, "top_p": args.top_p}
    elif args.temperature is not None or args.top_p is not None:
        raise InputError("--temperature and --top-p apply to sampling: add --sample")
    if args.layer is not None and not args.steps:
        raise InputError(
            "--layer chooses the layer --steps prints: add --steps (to capture only some layers, use --layers)"
        )
    preflight(args, args.prompt, layer=args.layer, part="decoder", what="prompt", generates=True)
    with loading_bars(args):
        gen = generate(
            args.model,
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            add_bos=args.add_bos,
            **loading_kwargs(args),
            check=args.check,
            heads=args.heads,
            seed=args.seed if args.sample else None,  # the greedy choice draws nothing: its record says no seed
            **{k: v for k, v in sampling.items() if v is not None},
        )
    print(args.prompt + gen.text if not gen.capture.model.get("encoder_decoder") else gen.text)
    stopped = "the model ended the text" if gen.info["stopped"] == "eos" else "max_new_tokens reached"
    checked = "" if args.check == "off" else f"; every generated row checked against its step ({args.check})"
    print(f"{len(gen)} new tokens after {gen.prompt_length} ({stopped}){checked}", file=sys.stderr)
    if args.steps:
        layer = args.layer if args.layer is not None else max(gen.capture.layer_indices("decoder"))
        over = "heads" if args.heads is None else f"heads {','.join(map(str, gen.capture.kept_heads('decoder')))}"
        print(f"what each new token attended to most (layer {layer}, mean over {over}):")
        for i in range(len(gen)):
            step = gen.step(i)
            top = ", ".join(f"{t}@{p}={w:.2f}" for p, t, w in step.top(3, layer=layer))
            print(f"  {i:>4} {step.token!r:>14}  {top}")
    if args.out:
        path = gen.save(args.out)
        print(f"saved to {path} (open it with: attnviz app --capture {path})", file=sys.stderr)
    return 0


# the options that say how a model runs: read only when there is a model to run (not with --capture)
_RUN_OPTIONS = (
    ("model", "MODEL"),
    ("text", "TEXT"),
    ("layers", "--layers"),
    ("heads", "--heads"),
    ("device", "--device"),
    ("dtype", "--dtype"),
    ("attn_implementation", "--attn-implementation"),
    ("max_length", "--max-length"),
    ("add_bos", "--add-bos"),
    ("target", "--target"),
)


def _refuse_run_options(args, command: str) -> None:
    """With ``--capture FILE`` nothing runs: a model, a text or a loading option given too is refused, not ignored."""
    given = [name for dest, name in _RUN_OPTIONS if getattr(args, dest, None) not in (None, False)]
    if given:
        raise InputError(
            f"attnviz {command}: --capture reads a saved capture, so {', '.join(given)} would be ignored; "
            "give MODEL TEXT (and its options), or --capture FILE alone"
        )


def cmd_validate(args) -> int:
    """``attnviz validate``: recompute every head and compare it with the model's own numbers (exit 1 over tolerance)."""
    if args.out:
        check_writable(args.out)
    if args.capture:
        from .. import (
            load,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
        )

        _refuse_run_options(args, "validate")
        cap = load(args.capture)
    else:
        if not args.model or not args.text:
            raise InputError("attnviz validate: give MODEL TEXT, or --capture FILE")
        preflight(args, args.text)
        cap = _capture(args, check="full")  # every row against the kernel's output, its weights where it has them
    report = cap.validate()
    print(report)
    if args.out:
        written_as_csv(report.to_pandas(), args.out, index=False)
        print(f"per layer/head errors written to {args.out}")
    return 0 if report.passed else 1


def cmd_coref(args) -> int:
    """``attnviz coref``: rank the heads by how much a pronoun attends to its candidates."""
    from ..analysis import (
        rank_heads,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
    )

    check_part(args, "coref", ("encoder", "decoder"))
    candidates = [c.strip() for c in args.candidates.split(",")] if args.candidates else None
    for flag, words in (("--pronoun", [args.pronoun]), ("--candidates", candidates or [])):
        for word in words:  # a word missing from the text is said before the model loads
            if not word or word.lower() not in args.text.lower():
                raise InputError(f"{flag} {word!r} is not in the text {args.text!r}: give a word of it")
    preflight(args, args.text)
    cap = _capture(args)
    ranking = rank_heads(cap, args.pronoun, candidates, exclude_sinks=args.exclude_sinks, part=args.part)
    print(ranking)
    print(ranking.table.head(args.top).round(3).to_string(index=False))
    return 0


def _token(value: str) -> int | str:
    """A ``--query`` / ``--key``: a token position when it is a number, else a word of the text."""
    return int(value) if value.lstrip("-").isdigit() else value


def cmd_explain(args) -> int:
    """``attnviz explain``: one head's score of a query–key pair, taken apart into the pairs of components
    (embeddings, earlier heads, MLPs, biases) that wrote the query and the key; the top pairs and the check."""
    from .. import (  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
        capture,
        load_model,
        qk_attribution,
    )

    preflight(args, args.text, layer=args.layer, head=args.head)
    with loading_bars(args):
        model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype)
    cap = capture(model, args.text, tokenizer=tokenizer, layers=[args.layer], add_bos=args.add_bos)
    assert not isinstance(cap, list)  # one text, one capture
    versus = None if args.versus is None else _token(args.versus)
    why = qk_attribution(
        model, cap, args.layer, args.head, _token(args.query), _token(args.key), versus=versus, tokenizer=tokenizer
    )
    q, k, v = why.tokens
    against = "" if v is None else f" − s(→ {v!r} @{why.versus})"
    print(
        f"layer {why.layer} head {why.head}: {q!r} @{why.query} → {k!r} @{why.key}{against}\n"
        f"the model's score {why.score:+.4f}, Σ pairs {why.total:+.4f} (relative error {why.error:.1e}, "
        f"tolerance {why.tolerance:.0e}; {len(why.query_labels)} × {len(why.key_labels)} components)"
    )
    print(f"\ntop {args.top} pairs (query component × key component):")
    print(why.top(args.top).round(4).to_string(index=False))
    for side, series in (("query", why.query_side), ("key", why.key_side)):
        top = ", ".join(f"{label} {value:+.3f}" for label, value in series.head(5).items())
        print(f"\n{side} side, top 5: {top}")
    return 0


EXPORT_VIEWS = ("heatmap", "head", "model", "validation")


def _check_shown(args, cap) -> None:
    """``export --capture FILE``'s ``--part``, ``--layer`` and ``--head`` against what the file holds,
    said as the options (as preflight says them against a model)."""
    if args.part is not None and args.part not in cap.parts:
        raise InputError(f"--part {args.part}: {args.capture} holds {', '.join(cap.parts)}; give one of them")
    part = args.part or cap.parts[0]
    held = cap.layer_indices(part)
    if args.layer is not None and args.layer not in held:
        raise OutOfRangeError(
            f"--layer {args.layer}: {args.capture} holds layers {held} of its {part}; give one of them"
        )
    heads = cap.info(part)["n_heads"]
    if not 0 <= args.head < heads:
        raise OutOfRangeError(f"--head {args.head} is out of range: {args.capture} has heads 0..{heads - 1}")
    kept = cap.kept_heads(part)
    if args.head not in kept:
        raise OutOfRangeError(
            f"--head {args.head}: {args.capture} kept heads {','.join(map(str, kept))} of its {part}; give one of them"
        )


def cmd_export(args) -> int:
    """``attnviz export``: a capture's views as one self-contained HTML file."""
    from .. import (  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
        figures,
        load,
    )

    check_part(args, "export", ENCODER_DECODER)
    if not args.out.lower().endswith((".html", ".htm")):
        raise InputError(f"attnviz export writes one HTML page: give an .html path for -o (got {args.out!r})")
    check_writable(args.out)
    views = names(args.views)
    unknown = [v for v in views if v not in EXPORT_VIEWS]
    if unknown or not views:
        raise InputError(f"--views takes a comma-separated list of {', '.join(EXPORT_VIEWS)}; got {args.views!r}")
    if args.capture:
        _refuse_run_options(args, "export")
        cap = load(args.capture)
        if args.head is None:
            args.head = cap.kept_heads(args.part if args.part in cap.parts else cap.parts[0])[0]
        _check_shown(args, cap)
    elif args.model and args.text:
        if args.head is None:
            args.head = min(args.heads) if args.heads else 0
        preflight(args, args.text, layer=args.layer, head=args.head, part=args.part or "encoder")
        cap = _capture(args)
    else:
        raise InputError("attnviz export: give MODEL TEXT, or --capture FILE")
    part = args.part if args.part or len(cap.parts) == 1 else cap.parts[0]
    layer = args.layer if args.layer is not None else cap.layer_indices(part)[0]
    build = {
        "heatmap": lambda: [figures.heatmap(cap, layer, args.head, words=args.words, part=part)],
        "head": lambda: [figures.head_view(cap, layer, words=args.words, part=part)],
        "model": lambda: [figures.model_view(cap, words=args.words, part=part, selected=(layer, args.head))],
        "validation": lambda: [
            figures.validation_map(cap.validate(), part=cap.resolve_part(part)),
            figures.validation_comparison(cap, layer, args.head, part=part),
        ],
    }
    figs = [fig for view in views for fig in build[view]()]
    path = figures.to_html(
        figs, args.out, title=f"attnviz — {cap.model.get('name')}: {cap.text[:80]}", provenance=cap.provenance
    )
    print(f"{len(figs)} figure(s) written to {path} (self-contained: opens offline)")
    return 0


def cmd_info(args) -> int:
    """``attnviz info FILE``: what a saved capture holds and where it came from, one ``field: value`` line each."""
    from .. import load  # deferred: `attnviz --help` answers before torch and transformers load

    cap = load(args.file)
    lines = {
        "file": args.file,
        "text": cap.text if len(cap.text) <= 80 else cap.text[:77] + "…",
        "tokens": len(cap.tokens),
        "parts": ", ".join(f"{p} ({len(cap.layer_indices(p))} layers)" for p in cap.parts),
    }
    if "generation" in cap.model:
        gen = cap.model["generation"]
        lines["generation"] = (
            f"{gen.get('steps')} steps after a prompt of {gen.get('prompt_length')} (stopped: {gen.get('stopped')})"
        )
    provenance = cap.provenance
    if not provenance:
        lines["provenance"] = "none recorded (the file was saved before attnviz recorded where a capture came from)"
        for fact in ("name", "class", "backend", "dtype", "device"):
            if fact in cap.model:
                lines[fact] = cap.model[fact]
    else:
        lines.update(provenance)
    width = max(len(key) for key in lines)
    for key, value in lines.items():
        print(f"{key + ':':<{width + 1}} {'-' if value is None else shown(value)}")
    return 0


def head_pairs(value: str) -> list[tuple[int, int]]:
    """``--heads 3:4,10:0``: (layer, head) pairs."""
    pairs = []
    for item in names(value):
        layer, sep, head = item.partition(":")
        if not sep or not layer.strip().isdigit() or not head.strip().isdigit():
            raise InputError(f"--heads takes LAYER:HEAD pairs separated by commas, e.g. 3:4,10:0; got {item!r}")
        pairs.append((int(layer), int(head)))
    return pairs


def cmd_report(args) -> int:
    """``attnviz report``: a capture (a saved file, or MODEL TEXT run now) as one self-contained HTML report."""
    if not args.out.lower().endswith((".html", ".htm")):
        raise InputError(f"attnviz report writes one HTML page: give an .html path for -o (got {args.out!r})")
    check_writable(args.out)
    heads = head_pairs(args.report_heads) if args.report_heads else None  # its own dest: capture's --heads differs
    if args.model and args.text is None:
        if not Path(args.model).is_file():
            raise InputError(
                f"attnviz report: {args.model!r} is not a capture file; give CAPTURE.attnviz, or MODEL TEXT"
            )
        from .. import (
            load,  # deferred: `attnviz --help` and a refused argument answer before torch and transformers load
        )

        given = [name for dest, name in _RUN_OPTIONS[2:] if getattr(args, dest, None) not in (None, False)]
        if given:
            raise InputError(
                f"attnviz report: {args.model} is a saved capture, so {', '.join(given)} would be ignored; "
                "give MODEL TEXT (and its options), or CAPTURE.attnviz alone"
            )
        cap = load(args.model)
    elif args.model and args.text:
        preflight(args, args.text, layer=args.layer, head=args.head)
        cap = _capture(args)
    else:
        raise InputError("attnviz report: give CAPTURE.attnviz (a saved capture), or MODEL TEXT")
    from .. import (
        figures,  # deferred: plotly loads when a page is written
    )

    page = figures.report(cap, args.out, heads=heads, layer=args.layer, head=args.head, budget_mb=args.budget_mb)
    print(f"report of {cap.n_tokens} tokens written to {args.out} ({len(page.encode()) / 1e6:.1f} MB, opens offline)")
    return 0
