"""Load and soak (#19): one dashboard server, many concurrent sessions, mixed interactions on long texts.

One ``create_app`` (a bounded capture cache, ``--cache-mb``) is served by werkzeug, threaded, in a thread
of this process; ``--sessions`` pages (``bench/soak_session.py``, through ``bench/dash_http.py``: each its
own page load, driven over HTTP as dash-renderer drives it, background callbacks included) each make
``--steps`` random interactions (seeded): run one of the shared texts (``--sizes`` tokens, so the cache and
the shared view jobs are exercised; past ``background_from`` the run is a background capture job), switch
layer, head or units, open a tab (heatmap, model view, head statistics, rollout, validation, coreference,
lab — a heavy view of a long text is a worker-thread job polled to its end), zoom the heatmap, cancel a
view job mid-way (then Compute), cancel a background capture mid-way. Then, one page at a time, a view
job's worker thread is killed from outside (``PyThreadState_SetAsyncExc(…, SystemExit)``) and a background
capture's process is SIGKILLed, and the bench records what the page shows and that it stays usable.

Checks (exit 1 when one fails):
- no error response: every callback answers 200 or 204, no "Something went wrong" or failed job in any
  answer, the page's message line empty (a capture the bounded cache let go is counted, not an error:
  the session presses Run again, as a user would);
- no cross-talk: each page's store holds the key of its own text, its status line says its own token
  count, and the titles that name a token count name its own;
- memory: the server's RSS after the run, once ``malloc_trim(0)`` gave back the heap glibc kept freed,
  ≤ RSS after warm-up + the cache bound + the derived-results bound (cache_bytes / 4); the untrimmed RSS
  and what the capture cache holds are reported beside it;
- no temporary files: no ``*.partial``, request or capture file left in the capture folder after the
  sessions (what the killed capture process leaves is reported, not checked), and nothing ``attnviz-*``
  in the temp folder once the server's process has exited (the bench runs itself in a child process
  with a temp folder of its own to see that); no background job's process still running at the end;
- a killed view worker: the job bar says it stopped and offers Compute, another view draws meanwhile,
  and after Compute the view draws.

    .venv/bin/python bench/soak.py --out soak.md    # 8 sessions x 50 steps, tiny Llama: ~3 min here (+2 per stuck job)
    .venv/bin/python bench/soak.py --model smollm2   # the embedded SmolLM2 (its heavy views take minutes on 2 cores)

The model is a tiny random Llama (2 layers × 4 heads, 8,192 positions) reading SmolLM2's tokenizer, as
tests/conftest.py's ``llama_folder``: the texts and every code path (background captures past
``--background-from``, the worker-thread view jobs, the bounded caches) are the real ones, while 400
interactions fit in minutes on two shared cores; SmolLM2 would spend them computing. The server runs in a
thread of this process and the pages' client too, so the RSS peak includes the client; the warm-up and
end figures are taken with the pages released. ``--timeout``: a background job still running after it is
cancelled, as a user would, and counted as an error.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak_session import (  # noqa: E402 - bench/ is the script's folder: on the path
    KINDS,
    TABS,
    Memory,
    Session,
    Stats,
    Text,
    figure_title,
    percentile,
    text_of,
    tiny_folder,
)


# ---------------------------------------------------------------- the killed workers
def kill_view_worker(session: Session, text: Text, stats: Stats) -> dict:
    """A view job's worker thread killed from outside: what the page shows, and whether it stays usable."""
    session.kind = "killed view worker"
    session.run(text)
    killed: list[str] = []
    stop = threading.Event()

    def killer() -> None:  # the first job thread that appears gets SystemExit raised in it
        while not stop.is_set():
            for thread in threading.enumerate():
                if thread.name.startswith("attnviz-job") and thread.ident is not None:
                    hit = ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(thread.ident), ctypes.py_object(SystemExit)
                    )
                    if hit:
                        killed.append(thread.name)
                        return
            time.sleep(0.001)

    watcher = threading.Thread(target=killer, daemon=True)
    watcher.start()
    session.expect_stopped = True
    session.page.set_props({("view-tabs", "value"): "model"})
    session.poll_view_jobs()
    stop.set()
    watcher.join()
    bar = str(session.page.get("view-job-text", "children") or "")
    shown = figure_message(session.page.get("model-view-graph", "figure"))
    session.tab("heatmap")  # another view still draws
    heatmap_ok = bool(figure_title(session.page.get("heatmap-graph", "figure")))
    session.page.click("view-job-start")  # Compute
    session.tab("model")
    session.expect_stopped = False
    after = figure_message(session.page.get("model-view-graph", "figure"))
    session.check()
    ok = bool(killed) and "stopped" in bar and "Compute" in bar and heatmap_ok and not after
    if killed and not ok:
        stats.error(
            session, f"killed view worker: bar {bar[:120]!r}, view {shown[:80]!r}, after Compute {after[:80]!r}"
        )
    stats.count("view workers killed", len(killed))
    return {"killed": killed, "bar": bar, "view": shown, "heatmap": heatmap_ok, "after compute": after, "ok": ok}


def kill_capture_process(session: Session, text: Text, stats: Stats) -> dict:
    """A background capture's process SIGKILLed: what the page then shows (reported: the lead decides)."""
    session.kind = "killed capture process"
    before = set(p.pid for p in psutil.Process().children(recursive=True))
    session.page.props[("text-input", "value")] = text.text
    session.page.click("run-button", wait_background=False)
    killed = []
    deadline = time.monotonic() + 30
    while session.page.jobs and not killed and time.monotonic() < deadline:
        for child in psutil.Process().children(recursive=True):
            if child.pid not in before:
                child.send_signal(signal.SIGKILL)
                killed.append(child.pid)
        time.sleep(0.005)
    session.page.wait_jobs()
    shown = {
        "message": str(session.page.get("message", "children") or ""),
        "status": str(session.page.get("status", "children") or ""),
        "progress text": str(session.page.get("capture-progress-text", "children") or ""),
        "store is the killed text's": (session.page.get("capture-store", "data") or {}).get("key") == text.key,
    }
    stats.count("capture processes killed", len(killed))
    session.check()  # the page still holds its previous capture
    short = min(session.texts, key=lambda t: t.n)
    session.run(short)  # and runs another text
    session.check()
    return {"killed": killed, **shown, "usable after": session.text is short}


def figure_message(figure) -> str:
    """The message a message figure carries (its one annotation), else ''."""
    layout = (figure or {}).get("layout", {}) if isinstance(figure, dict) else {}
    notes = layout.get("annotations") or []
    return str(notes[0].get("text", "")) if len(notes) == 1 and not figure.get("data") else ""


# ---------------------------------------------------------------- the run
def serve(app):
    from werkzeug.serving import make_server  # deferred: only the child process serves

    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True, name="soak-server").start()
    return server, f"http://127.0.0.1:{server.server_port}"


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*") if p.name.endswith((".partial", ".request.json", ".attnviz")))


def soak(args) -> tuple[list[str], bool]:
    """The soak in this process: the table's lines, and whether every check passed."""
    from attnviz.dashboard import create_app
    from attnviz.dashboard.app import DEFAULT_TEXT
    from attnviz.dashboard.captures import Captures, wants_bos

    import attnviz  # deferred: heavy, and only the child process runs the server

    tmp = Path(tempfile.gettempdir())
    model = args.model if args.model != "tiny" else tiny_folder(tmp)
    tokenizer = attnviz.load_model(model)[1]
    cache_bytes = args.cache_mb << 20
    before = set(tmp.glob("attnviz-*"))
    app = create_app({model: model}, default_model=model, cache_bytes=cache_bytes, background_from=args.background_from)
    made = set(tmp.glob("attnviz-*")) - before
    capture_folder = next(p for p in made if p.name.startswith("attnviz-captures-"))
    jobs_folder = next(p for p in made if p.name.startswith("attnviz-jobs-"))
    bos = wants_bos(model)
    measure = Captures({model: model}, folder=tmp / "soak-tokenize")
    texts = [Text(measure, model, text_of(tokenizer, n, i), bos) for i, n in enumerate(args.sizes)]
    initial = Text(measure, model, DEFAULT_TEXT, bos)  # what a page runs as it opens
    kill_texts = [Text(measure, model, text_of(tokenizer, max(args.sizes), 50 + i), bos) for i in range(2)]
    server, base = serve(app)
    stats = Stats()
    memory = Memory()
    memory.start()
    t0 = time.perf_counter()
    warm = Session("warm-up", base, texts, args.seed, stats, args.timeout, initial)
    warm.start()
    warm.run(min(texts, key=lambda t: t.n))
    for tab in TABS:
        warm.tab(tab)
    warm.page = None  # the client's pages live in this process too: what they hold is not the server's
    gc.collect()
    rss_warm = memory.rss()
    memory.peak = rss_warm
    sessions = [
        Session(f"s{i}", base, texts, args.seed + 1 + i, stats, args.timeout, initial) for i in range(args.sessions)
    ]
    longest = max(args.sizes)
    for i, session in enumerate(sessions):  # variants 100+ are nobody else's texts
        session.fresh = [Text(measure, model, text_of(tokenizer, longest, 100 + 10 * i + j), bos) for j in range(4)]

    def drive(session: Session) -> None:
        try:
            session.start()
            for _ in range(args.steps):
                session.step()
        except Exception as err:  # noqa: BLE001 - a session that breaks is the bench's error, not its end
            stats.error(session, f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=drive, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    soak_s = time.perf_counter() - t0
    left = leftovers(capture_folder)  # what the sessions' runs and cancels left
    killer = Session("killer", base, texts, args.seed, stats, args.timeout, initial)
    killer.start()
    view_kill = kill_view_worker(killer, kill_texts[0], stats)
    capture_kill = kill_capture_process(killer, kill_texts[1], stats)
    for session in [*sessions, killer]:
        session.page = None
    gc.collect()
    rss_end = memory.rss()
    held = [o for o in gc.get_objects() if type(o).__name__ == "Captures"]  # the app's: what it holds
    cache_held = sum(c.cache.total_bytes for c in held)
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc_trim(0)  # freed heap the allocator kept (its per-thread arenas) goes back to the system
    rss_trimmed = memory.rss()
    memory.stop.set()
    left_by_kill = sorted(set(leftovers(capture_folder)) - set(left))
    jobs_left = [p.name for p in jobs_folder.glob("*") if not p.name.startswith("cache.db")]
    alive = [  # background jobs' processes still running (a finished one not yet reaped is a zombie)
        child for child in psutil.Process().children(recursive=True) if child.status() != psutil.STATUS_ZOMBIE
    ]
    for child in alive:
        child.kill()
    server.shutdown()
    del app, sessions, warm, killer
    gc.collect()
    captures_gone = not capture_folder.exists()
    bound = cache_bytes + cache_bytes // 4
    checks = {
        "no error responses": not stats.errors,
        "no cross-talk": not stats.crosstalk,
        "RSS after the run (freed heap trimmed) ≤ warm-up + bound": rss_trimmed <= rss_warm + bound,
        "no temporary files left after the sessions": not left and not jobs_left,
        "no background job process left": not alive,
        "killed view worker: message, page usable": view_kill["ok"],
    }
    mb = 2**20
    lines = [
        f"# Load and soak: {args.sessions} sessions × {args.steps} interactions, one server",
        "",
        f"model {args.model} ({model}), texts of {', '.join(f'{t.n:,}' for t in texts)} tokens (BOS included), "
        f"background_from {args.background_from}, cache_bytes {args.cache_mb} MB, seed {args.seed}; "
        f"{soak_s:.0f} s for the sessions; load average at the start {args.load:.1f} (2 cores shared)",
        "",
        "| interaction | n | p50 s | p95 s |",
        "|---|---:|---:|---:|",
    ]
    for kind in KINDS:
        values = stats.seconds.get(kind, [])
        lines.append(f"| {kind} | {len(values)} | {percentile(values, 0.5):.2f} | {percentile(values, 0.95):.2f} |")
    lines += [
        "",
        "| figure | value |",
        "|---|---|",
        f"| requests (callback requests + background polls) | {stats.requests:,} ({stats.polls:,} polls) |",
        f"| errors | {len(stats.errors)} |",
        f"| cross-talk | {len(stats.crosstalk)} |",
        f"| RSS warm-up / peak / end | {rss_warm / mb:,.0f} / {memory.peak / mb:,.0f} / {rss_end / mb:,.0f} MB |",
        f"| RSS end, after malloc_trim(0) | {rss_trimmed / mb:,.0f} MB |",
        f"| RSS end − warm-up vs bound (cache + cache/4) | {(rss_end - rss_warm) / mb:+,.0f} MB; trimmed "
        f"{(rss_trimmed - rss_warm) / mb:+,.0f} MB; bound {bound / mb:,.0f} MB |",
        f"| the capture cache holds at the end | {cache_held / mb:,.1f} MB |",
        f"| capture folder after the sessions | {', '.join(left) or 'no partial, request or capture file'} |",
        f"| capture folder after the killed capture process (reported, not a check) | {', '.join(left_by_kill) or 'nothing more'} |",
        f"| jobs folder after the run | {', '.join(jobs_left) or 'only the diskcache database'} |",
        f"| background job processes still alive at the end (killed) | {len(alive)} |",
        f"| capture folder once the app is deleted (gc) | {'removed' if captures_gone else 'still there (removed at exit)'} |",
        *[f"| {what} | {n} |" for what, n in sorted(stats.counts.items())],
        f"| killed view worker: bar says | {view_kill['bar'][:160]} |",
        f"| killed view worker: after Compute | {'draws' if not view_kill['after compute'] else view_kill['after compute'][:80]} |",
        f"| killed capture process: message line | {capture_kill['message'][:160] or '(empty)'} |",
        f"| killed capture process: progress text | {capture_kill['progress text'][:160] or '(empty)'} |",
        f"| killed capture process: page runs another text | {capture_kill['usable after']} |",
        "",
        *[f"- {'ok' if ok else 'FAILED'}: {what}" for what, ok in checks.items()],
        *[f"  - error: {e}" for e in stats.errors[:20]],
        *[f"  - cross-talk: {e}" for e in stats.crosstalk[:20]],
    ]
    return lines, all(checks.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 1536, 2048, 768])
    parser.add_argument("--model", default="tiny", help='"tiny" (a random Llama, SmolLM2\'s tokenizer) or a name')
    parser.add_argument("--cache-mb", type=int, default=256)
    parser.add_argument("--background-from", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one request or job may take")
    parser.add_argument("--out", help="write the table (markdown) here too")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--load", type=float, default=os.getloadavg()[0], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        lines, ok = soak(args)
        print(json.dumps({"lines": lines, "ok": ok}), flush=True)
        sys.exit(0)
    with tempfile.TemporaryDirectory(prefix="soak-tmp-") as tmp:
        env = {**os.environ, "TMPDIR": tmp, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        command = [sys.executable, __file__, *sys.argv[1:], "--child", "--load", str(args.load)]
        child = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
        report = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else None
        left = sorted(p.name for p in Path(tmp).glob("attnviz-*"))
    if report is None:
        print(f"soak: the server's process failed (exit {child.returncode})", file=sys.stderr)
        sys.exit(1)
    lines, ok = report["lines"], report["ok"] and not left
    at = lines.index(next(line for line in lines if line.startswith("- ")))
    lines.insert(at, f"| attnviz-* in the temp folder once the server's process exited | {', '.join(left) or 'none'} |")
    lines.insert(at + 1, "")
    lines.append(f"- {'ok' if not left else 'FAILED'}: nothing attnviz-* left once the server's process exited")
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
