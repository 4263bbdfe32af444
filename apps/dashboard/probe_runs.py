"""Where the Coreference view keeps a researcher's probe sets and their results: on the server, never on
the page.

- An uploaded probe file (``dcc.Upload`` sends it once, base64) is written to a folder of its own in
  the server's folder, under its own name, and named to the page by a random token; the page's store holds the token and the
  file's name, and the Upload's contents are cleared, so the file never travels back.
- A probe set's result is made by a background job, a fork of the server: the job writes it to the
  folder (a pickle written atomically, :mod:`attnviz.files`) and hands the page its key; the server
  reads it back on first use into a small cache of the most recent results. The per-probe table's
  pages and the drill-down into the AttentionLab read the result by that key.

The page may send anything: a token or key is used only when it has the form this module gives, so
no request names a path. Only the most recent ``KEEP`` uploads and results stay on disk.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import pickle
import re
import shutil
import threading
import uuid
from collections import OrderedDict
from pathlib import Path

import attnviz
import attnviz.files
from attnviz.analysis import ProbeResult

SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet")  # what load_probes reads from a file
MAX_UPLOAD_BYTES = 64 << 20  # dcc.Upload refuses a larger file (the request carries it base64: 4/3 of it)
KEEP = 16  # uploads, and results, kept on disk (the oldest go first)
IN_MEMORY = 4  # results the server holds unpickled at once
_TOKEN = re.compile(r"[0-9a-f]{32}")


class ProbeRunGone(attnviz.AttnvizError):
    """The page names an upload or a result the server no longer holds (the page says what to do)."""


class ProbeRuns:
    """The uploads and results of one app, in ``folder`` (made with the first of them: a server that never
    runs a probe set leaves nothing in the captures' folder)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._lock = threading.Lock()
        self._results: OrderedDict[str, ProbeResult] = OrderedDict()

    # -- uploads
    def save_upload(self, filename: str, contents: str) -> str:
        """Write ``contents`` (a ``data:…;base64,…`` URL, what ``dcc.Upload`` sends) to a folder of the upload's
        own, under its own name (letters, digits, ``._-`` kept: the reader names the set and its probes by
        it, and tells its format from its suffix), and return the upload's token."""
        name = str(filename or "")
        suffix = Path(name.lower()).suffix
        if suffix not in SUFFIXES:
            raise attnviz.InputError(
                f"{name[:80]!r}: a probe file ends in {', '.join(SUFFIXES)}; rename it or convert it to one of them"
            )
        _, sep, data = str(contents or "").partition(";base64,")
        try:
            raw = base64.b64decode(data, validate=True) if sep else b""
        except (binascii.Error, ValueError) as err:
            raise attnviz.InputError(f"{name[:80]!r} did not arrive whole (not base64): upload it again") from err
        if not raw:
            raise attnviz.InputError(f"{name[:80]!r} is empty: choose a probe file with probes in it")
        token = uuid.uuid4().hex
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).stem).strip("._")[:80] or "probes"
        folder = self.folder / f"upload-{token}"
        folder.mkdir(parents=True)
        self._write(folder / f"{stem}{suffix}", raw)
        self._forget_old("upload-*")
        return token

    def upload_path(self, token: object) -> Path:
        """The file of the upload ``token`` (a :class:`ProbeRunGone` when the server holds none)."""
        if isinstance(token, str) and _TOKEN.fullmatch(token):
            found = [p for p in (self.folder / f"upload-{token}").glob("*") if p.suffix in SUFFIXES]
            if found:
                return found[0]
        raise ProbeRunGone(
            "The uploaded probe file is no longer on the server (it keeps the most recent uploads, and forgets "
            "them when it restarts). Upload it again."
        )

    # -- results
    def keep(self, result: ProbeResult) -> str:
        """Write ``result`` where the server reads it (called in the background job) and return its key."""
        key = uuid.uuid4().hex
        self._write(self.folder / f"result-{key}.pickle", pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        self._forget_old("result-*.pickle")
        return key

    def result(self, key: object) -> ProbeResult:
        """The result the page names by ``key``: from memory, else from its file (a :class:`ProbeRunGone`
        when it is gone)."""
        if not isinstance(key, str) or not _TOKEN.fullmatch(key):
            raise ProbeRunGone("Run the probe set first.")
        with self._lock:
            if key in self._results:
                self._results.move_to_end(key)
                return self._results[key]
        path = self.folder / f"result-{key}.pickle"
        try:
            # our own file: the job of this server wrote it (the key's form names no other path)
            result = pickle.loads(path.read_bytes())  # noqa: S301
        except OSError as err:
            raise ProbeRunGone(
                "This probe set's result is no longer on the server (it keeps the most recent results, and forgets "
                "them when it restarts). Press Run probe set again."
            ) from err
        with self._lock:
            self._results[key] = result
            while len(self._results) > IN_MEMORY:
                self._results.popitem(last=False)
        return result

    # -- files
    def _write(self, path: Path, data: bytes) -> None:
        """``data`` at ``path``, written atomically (:mod:`attnviz.files`): a reader never sees half a file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        attnviz.files.write_bytes(path, data)

    def _forget_old(self, pattern: str) -> None:
        """All but the ``KEEP`` newest of the uploads' folders or the results' files."""
        kept = list(self.folder.glob(pattern))  # a write's temporary file is hidden (".NAME…"): not matched
        for old in sorted(kept, key=lambda p: p.stat().st_mtime)[:-KEEP]:
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
                continue
            with contextlib.suppress(OSError):
                old.unlink()
