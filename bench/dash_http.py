"""A Dash page driven over HTTP, as dash-renderer drives it: what ``bench/soak.py`` runs many of at once.

One :class:`Page` is one page load: ``GET /`` (its signed ``endId``), ``GET /_dash-layout`` (the page's
components and their props: the page's state), ``GET /_dash-dependencies`` (the callbacks). ``set(...)``
changes props as a user would and runs what the renderer would run: every callback with one of those
props among its inputs, in dependency order (a callback waits while another pending one writes its
inputs), then the callbacks their outputs trigger, until the page is quiet. Each request is built from
the dependency list — ``output``, ``outputs``, ``inputs`` / ``state`` with the page's current values,
``changedPropIds`` — never by hand. Background callbacks follow the renderer's protocol: the first answer
carries ``cacheKey`` and ``job``; the page polls with them (inputs nulled) at the callback's interval,
applying ``progress`` and ``sideUpdate``, until an answer has ``response`` (or 204: the job was
cancelled or its process is gone); a cancel input sends ``cancelJob``. Clientside callbacks and
pattern-matching ids are not run (the caller sets what they would set). No attnviz import.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import requests


def parse_output(output: str) -> list[tuple[str, str]]:
    """``"a.b"`` or ``"..a.b...c.d@hash.."`` -> ``[("a", "b"), ("c", "d")]`` (a duplicate output's hash dropped)."""
    parts = output[2:-2].split("...") if output.startswith("..") else [output]
    return [tuple(p.split("@")[0].rsplit(".", 1)) for p in parts]  # type: ignore[misc]


@dataclass
class Call:
    """One callback request and its answer."""

    output: str
    status: int
    seconds: float
    body: str = ""
    polls: int = 0


@dataclass(eq=False)  # one per callback: compared and hashed by identity
class Dependency:
    spec: dict
    outputs: list[tuple[str, str]] = field(default_factory=list)
    inputs: list[tuple[str, str]] = field(default_factory=list)
    state: list[tuple[str, str]] = field(default_factory=list)

    @property
    def background(self) -> dict | None:
        return self.spec.get("background")

    @property
    def runnable(self) -> bool:
        ids = [i for i, _ in self.inputs + self.state + self.outputs]
        return not self.spec.get("clientside_function") and not any(i.startswith("{") for i in ids)


class Page:
    """One page load of a Dash app at ``base``; ``on_call(call)`` is told every callback request."""

    def __init__(
        self,
        base: str,
        on_call: Callable[[Call], None] | None = None,
        timeout: float = 300.0,
        job_timeout: float = 300.0,
    ) -> None:
        self.base, self.on_call, self.timeout, self.job_timeout = base, on_call, timeout, job_timeout
        self.http = requests.Session()
        index = self.http.get(base + "/", timeout=timeout)
        index.raise_for_status()
        config = re.search(r'id="_dash-config" type="application/json">(.*?)</script>', index.text, re.S)
        self.end_id = json.loads(config.group(1))["end_id"] if config else None
        self.props: dict[tuple[str, str], object] = {}
        self.ids: set[str] = set()
        self.walk(self.http.get(base + "/_dash-layout", timeout=timeout).json())
        self.deps = []
        for spec in self.http.get(base + "/_dash-dependencies", timeout=timeout).json():
            dep = Dependency(spec, parse_output(spec["output"]))
            dep.inputs = [(i["id"], i["property"]) for i in spec["inputs"]]
            dep.state = [(s["id"], s["property"]) for s in spec["state"]]
            self.deps.append(dep)
        self.jobs: dict[str, dict] = {}  # a running background job's handle, by its callback's output
        self.lock = threading.Lock()
        self.calls: list[Call] = []

    # -- the page's state
    def walk(self, node) -> None:
        """Take in a layout (or a callback's new children): each component with an id, and its props."""
        if isinstance(node, list):
            for child in node:
                self.walk(child)
        elif isinstance(node, dict) and "props" in node:
            props = node["props"]
            cid = props.get("id")
            if isinstance(cid, str):
                self.ids.add(cid)
                for prop, value in props.items():
                    self.props[(cid, prop)] = value
            for value in props.values():
                if isinstance(value, list | dict):
                    self.walk(value)

    def get(self, cid: str, prop: str):
        return self.props.get((cid, prop))

    def apply(self, updates: dict) -> set[tuple[str, str]]:
        """Set ``{id: {prop: value}}`` (or a background job's ``{"id.prop": value}``) on the page; returns
        the props that changed."""
        changed = set()
        nested: dict[str, dict] = {}
        for key, value in (updates or {}).items():
            if isinstance(value, dict) and not key.startswith("{") and "." not in key:
                nested.setdefault(key, {}).update(value)
            else:
                cid, prop = key.rsplit(".", 1)
                nested.setdefault(cid, {})[prop] = value
        for cid, props in nested.items():
            if cid.startswith("{"):
                continue
            for prop, value in props.items():
                if self.props.get((cid, prop), object()) != value:
                    changed.add((cid, prop))
                self.props[(cid, prop)] = value
                if prop == "children":
                    self.walk(value)
        return changed

    # -- what the user does
    def start(self) -> None:
        """The renderer's first pass: every callback not marked prevent_initial_call whose inputs are on the page."""
        first = [d for d in self.deps if not d.spec.get("prevent_initial_call") and self.present(d)]
        self.settle(first, set())

    def set_props(self, values: dict[tuple[str, str], object], *, wait_background: bool = True) -> None:
        """Change props as the user does, then run what they trigger until the page is quiet."""
        for key, value in values.items():
            self.props[key] = value
        self.settle(self.triggered(set(values)), set(values), wait_background=wait_background)

    def click(self, cid: str, *, wait_background: bool = True) -> None:
        self.set_props({(cid, "n_clicks"): (self.get(cid, "n_clicks") or 0) + 1}, wait_background=wait_background)

    # -- the renderer
    def present(self, dep: Dependency) -> bool:
        return dep.runnable and all(i in self.ids for i, _ in dep.inputs)

    def triggered(self, changed: set[tuple[str, str]]) -> list[Dependency]:
        return [d for d in self.deps if self.present(d) and changed & set(d.inputs)]

    def settle(
        self, pending: list[Dependency], changed: set, *, wait_background: bool = True, limit: int = 400
    ) -> None:
        pending = list(dict.fromkeys(pending))
        fired = 0
        while pending:
            writes = {o for d in pending for o in d.outputs}
            ready = [d for d in pending if not (set(d.inputs) & writes - set(d.outputs))] or pending[:1]
            for dep in ready:
                pending.remove(dep)
                new = self.fire(dep, changed, wait_background=wait_background)
                fired += 1
                if fired > limit:
                    raise RuntimeError(f"the page did not settle after {limit} callbacks")
                pending.extend(d for d in self.triggered(new) if d not in pending)
                changed = new

    def payload(self, dep: Dependency, changed: set) -> dict:
        def values(pairs):
            return [{"id": i, "property": p, "value": self.props.get((i, p))} for i, p in pairs]

        outputs = [{"id": i, "property": p} for i, p in dep.outputs]
        return {
            "output": dep.spec["output"],
            "outputs": outputs if dep.spec["output"].startswith("..") else outputs[0],
            "inputs": values(dep.inputs),
            "state": values(dep.state),
            "changedPropIds": [f"{i}.{p}" for i, p in dep.inputs if (i, p) in changed],
        }

    def post(self, body: dict, **args) -> tuple[requests.Response, float]:
        params = {"endId": self.end_id, **args} if self.end_id else args
        t0 = time.perf_counter()
        response = self.http.post(self.base + "/_dash-update-component", json=body, params=params, timeout=self.timeout)
        return response, time.perf_counter() - t0

    def fire(self, dep: Dependency, changed: set, *, wait_background: bool = True) -> set[tuple[str, str]]:
        """One callback, answered; its outputs (and side updates) applied. Returns the props that changed."""
        body = self.payload(dep, changed)
        args = {}
        for job in list(self.jobs.values()):  # the renderer's cancelJob: a cancel input of a running job
            if set(map(tuple, job.get("cancel") or [])) & {(i, p) for i, p in dep.inputs}:
                args["cancelJob"] = job["job"]
        response, seconds = self.post(body, **args)
        call = Call(dep.spec["output"], response.status_code, seconds, response.text)
        new: set = set()
        if response.status_code == 200:
            data = response.json()
            if dep.background and "cacheKey" in data:
                cancel = [(c["id"], c["property"]) for c in (data.get("cancel") or [])]
                self.jobs[dep.spec["output"]] = {**data, "cancel": cancel, "body": body, "dep": dep, "call": call}
                return new if not wait_background else self.finish(dep, call)
            new |= self.apply(data.get("sideUpdate"))
            new |= self.apply(self.answer(dep, data))
        self.record(call)
        return new

    def answer(self, dep: Dependency, data: dict) -> dict:
        if "response" not in data:
            return {}
        if data.get("multi"):
            return data["response"]
        cid, prop = dep.outputs[0]
        return {cid: data["response"]["props"]} if "props" in data["response"] else {cid: {prop: data["response"]}}

    def finish(self, dep: Dependency, call: Call) -> set[tuple[str, str]]:
        """Poll a background job until it answers (or is gone); the props that changed. A job still running
        after ``job_timeout`` seconds is cancelled, as a user would (its call's status: 599)."""
        job = self.jobs[dep.spec["output"]]
        nulled = {
            **job["body"],
            "inputs": [{**i, "value": None} for i in job["body"]["inputs"]],
            "state": [{**s, "value": None} for s in job["body"]["state"]],
        }
        interval = (dep.background or {}).get("interval", 500) / 1000
        new: set = set()
        deadline = time.monotonic() + self.job_timeout
        try:
            while True:
                time.sleep(interval)
                response, seconds = self.post(nulled, cacheKey=job["cacheKey"], job=job["job"])
                call.polls += 1
                call.seconds += seconds
                call.status, call.body = response.status_code, response.text
                if response.status_code != 200:
                    return new  # 204: cancelled, or the job's process gone; else an error
                data = response.json()
                new |= self.apply(data.get("progress"))
                new |= self.apply(data.get("sideUpdate"))
                if "response" in data:
                    return new | self.apply(self.answer(dep, data))
                if time.monotonic() > deadline:
                    call.status = 599
                    for cid, _prop in job["cancel"]:  # its Cancel button: cancelJob goes with the click
                        self.click(cid)
                    return new
        finally:
            self.jobs.pop(dep.spec["output"], None)
            self.record(call)

    def wait_jobs(self) -> None:
        """Poll the background jobs started with ``wait_background=False`` until each answers, then run
        what their outputs trigger."""
        while self.jobs:
            job = next(iter(self.jobs.values()))
            new = self.finish(job["dep"], job["call"])
            self.settle(self.triggered(new), new)

    def record(self, call: Call) -> None:
        """Tell ``on_call``, then keep the call without its body (a soak's pages must not hold every answer)."""
        if self.on_call is not None:
            self.on_call(call)
        call.body = ""
        with self.lock:
            self.calls.append(call)
