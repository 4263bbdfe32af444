"""What a GPU would feel of a capture, counted on the CPU: host syncs and kernel launches.

A GPU runs a forward asynchronously: the host queues kernels and goes on. Two things break that,
and both can be counted on a machine without a GPU, with a ``TorchFunctionMode`` that sees every
torch call:

- a **sync**: a call whose answer the host needs now, so it waits for every queued kernel —
  ``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``, ``torch.equal``, ``nonzero``, ``unique``,
  ``masked_select``, ``.numpy()``, and a blocking copy to the host (``.cpu()``, ``.to("cpu")`` without
  ``non_blocking=True``);
- a **launch**: a call that runs a kernel — anything that writes a tensor (an in-place op, ``out=``,
  a new tensor that shares no storage with its inputs). Views (``detach``, ``transpose``, slicing)
  and metadata (``.shape``, ``.dim()``) are free: they are counted apart, as ``other``.

:class:`Counter` counts both, split into *inside the forward* (between the model's own forward
pre-hook and hook) and *outside* it. ``python bench/launches.py`` prints the table for GPT-2 small's
shape (``GPT2Config()``, random weights) — the plain forward, a capture with the check off, with the
default check — and the same for a generation; ``tests/test_gpu_feel.py`` holds attnviz to its goals
with the same counter.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

#: calls whose result the host must wait for (on a GPU: every kernel queued before them)
SYNCING = {
    "item",
    "tolist",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__complex__",
    "__array__",
    "__format__",
    "__repr__",
    "numpy",
    "equal",
    "allclose",
    "nonzero",
    "nonzero_static",
    "argwhere",
    "unique",
    "unique_consecutive",
    "masked_select",
    "bincount",
    "cpu",
}
#: calls that read metadata only (no kernel, no sync)
METADATA = {
    "dim",
    "size",
    "stride",
    "numel",
    "nelement",
    "is_contiguous",
    "data_ptr",
    "element_size",
    "untyped_storage",
    "storage_offset",
    "is_floating_point",
    "is_complex",
    "__len__",
    "get_device",
    "is_pinned",
    "__hash__",
}


def _name(func: Callable) -> str:
    return getattr(func, "__name__", str(func))


_TAG = "_on_device"  # set on every tensor that would live on the GPU


def _tensors(values: Any) -> list[torch.Tensor]:
    return [leaf for leaf in tree_leaves(values) if isinstance(leaf, torch.Tensor)]


def _on_device(t: torch.Tensor) -> bool:
    return getattr(t, _TAG, False)


def _tag(values: Any) -> None:
    for t in _tensors(values):
        with contextlib.suppress(AttributeError, RuntimeError):
            setattr(t, _TAG, True)


def _storages(values: Any) -> set[int]:
    found = set()
    for t in _tensors(values):
        with contextlib.suppress(RuntimeError):
            found.add(t.untyped_storage().data_ptr())
    return found


def _host_target(args: tuple, kwargs: dict) -> bool | None:
    """Where a ``.to(...)`` call sends a tensor: True for the host (written ``"cpu"``), False for a
    device (a ``torch.device`` or another tensor: on a GPU machine, the model's device), None for a
    dtype-only call. On this CPU both are the CPU, so attnviz writes every copy to the host as
    ``.cpu()`` or ``.to("cpu")`` — a string — and every move to the model's device with its ``torch.device``."""
    for a in list(args[1:]) + [kwargs.get("device")]:
        if isinstance(a, str):
            return a == "cpu"
        if isinstance(a, (torch.device, torch.Tensor)):
            return False
    return None


@dataclass
class Tallies:
    """Counts of one place (inside or outside the forward)."""

    syncs: Tally = field(default_factory=Tally)  # the host waits for the device
    uploads: Tally = field(default_factory=Tally)  # pageable copies host -> device (torch waits for them too)
    launches: Tally = field(default_factory=Tally)  # kernels on the device
    host: int = 0  # torch calls on host tensors only (bookkeeping: no kernel, no wait)
    free: int = 0  # views and metadata of device tensors

    @property
    def n_syncs(self) -> int:
        return sum(self.syncs.values()) + sum(self.uploads.values())

    @property
    def n_launches(self) -> int:
        return sum(self.launches.values())


class Counter(TorchFunctionMode):
    """Counts syncs, uploads and launches while active; ``inside`` / ``outside`` the forward of
    ``model`` (its outermost calls: a generation's forwards all count as inside).

    Which tensors would live on a GPU is followed as the code runs: the model's parameters and
    buffers, every tensor made with a ``device=`` argument or moved ``.to(a device)``, and every result
    of a call that reads one of them. A call that reads none of them is host bookkeeping (a Python
    index, a row list) and costs the GPU nothing."""

    def __init__(self, model: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.inside = Tallies()
        self.outside = Tallies()
        self._depth = 0
        self._hooks: list[Any] = []
        self.forwards = 0
        if model is not None:
            _tag(list(model.parameters()) + list(model.buffers()))
            self._hooks = [
                model.register_forward_pre_hook(self._enter, prepend=True),
                model.register_forward_hook(self._leave, always_call=True),
            ]

    def _enter(self, *_: Any) -> None:
        self._depth += 1
        self.forwards += self._depth == 1

    def _leave(self, *_: Any) -> None:
        self._depth -= 1

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        where = self.inside if self._depth > 0 else self.outside
        name = _name(func)
        result = func(*args, **kwargs)
        device_in = any(_on_device(t) for t in _tensors((args, kwargs)))
        if name == "__get__" or name in METADATA:
            where.free += device_in
            where.host += not device_in
            return result
        if name == "to" or name == "cpu":
            host = True if name == "cpu" else _host_target(args, kwargs)
            if device_in and host and not kwargs.get("non_blocking"):
                where.syncs[name] += 1
            elif device_in and host:
                where.launches[name] += 1  # an asynchronous copy
            elif not device_in and host is False:
                where.uploads[name] += 1
            elif device_in and result is not args[0]:
                where.launches[name] += 1  # a dtype conversion
            if host is False or (device_in and not host):
                _tag(result)
            return result
        factory_on_device = isinstance(kwargs.get("device"), torch.device)
        if not device_in and not factory_on_device:
            where.host += 1
            return result
        _tag(result)
        if name in SYNCING:
            where.syncs[name] += 1
        elif not device_in and name in {"tensor", "as_tensor", "asarray"}:
            where.uploads[name] += 1
        elif name.endswith("_") and not name.startswith("__") or "out" in kwargs or name == "__setitem__":
            where.launches[name] += 1
        elif name.startswith("__i") and name.endswith("__"):  # __iadd__ and friends: in place
            where.launches[name] += 1
        else:
            made = _storages(result)
            if made and not made <= _storages((args, kwargs)):
                where.launches[name] += 1
            else:
                where.free += 1
        return result


@contextlib.contextmanager
def counting(model: torch.nn.Module | None = None) -> Iterator[Counter]:
    """A :class:`Counter` active for the block (its hooks on ``model`` removed after)."""
    counter = Counter(model)
    try:
        with counter:
            yield counter
    finally:
        counter.remove()


def count(model: torch.nn.Module, run: Callable[[], Any], warm: int = 1) -> Counter:
    """The counts of ``run()`` after ``warm`` uncounted runs (caches filled as a user's second call finds
    them; run under the counter too, so that what they cached from the model's tensors is on the device),
    with the records stacked as on a GPU (:data:`attnviz.workflows.capture.device_check.STACK_CPU`)."""
    from attnviz.workflows.capture import device_check

    stack, device_check.STACK_CPU = device_check.STACK_CPU, True
    try:
        with counting(model) as counter:
            for _ in range(warm):
                run()
            counter.inside, counter.outside, counter.forwards = Tallies(), Tallies(), 0
            run()
    finally:
        device_check.STACK_CPU = stack
    return counter


def gpt2(n_layer: int = 12):
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(GPT2Config(n_layer=n_layer), attn_implementation="sdpa").eval()


def table(n: int = 64, new_tokens: int = 8) -> list[tuple[str, Counter]]:
    """The counts of GPT-2 small at ``n`` tokens: its plain forward, captures (check off, default, full),
    a plain ``generate`` and attnviz's ``generate`` of ``new_tokens``."""
    import attnviz

    model = gpt2()
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    rows: list[tuple[str, Counter]] = []

    def plain():  # the last position's logits, as capture() asks for them
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False, logits_to_keep=1)

    rows.append(("plain forward", count(model, plain)))
    for check in ("off", "sample", "full"):
        rows.append(
            (f"capture, check={check}", count(model, lambda c=check: attnviz.capture(model, input_ids=ids, check=c)))
        )
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from generation_overhead import setup  # the generation bench's GPT-2 (a tokenizer whose words are ids)

    gen_model, _, _, _, plain_generate, captured = setup("gpt2", new_tokens)
    rows.append((f"plain generate ({new_tokens} tokens)", count(gen_model, plain_generate)))
    rows.append((f"attnviz.generate ({new_tokens} tokens)", count(gen_model, captured("sample"))))
    return rows


def _top(tally: Tally, k: int = 6) -> str:
    return ", ".join(f"{name} {n}" for name, n in tally.most_common(k)) or "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=8)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = table(args.tokens, args.new_tokens)
    print(f"GPT-2 small (GPT2Config(), random weights, sdpa), {args.tokens} tokens, torch {torch.__version__}")
    print(
        "| run | forwards | syncs inside | launches inside | syncs after | launches after | which syncs (inside; after) |"
    )
    print("|---|---|---|---|---|---|---|")
    for what, c in rows:
        print(
            f"| {what} | {c.forwards} | {c.inside.n_syncs} | {c.inside.n_launches} | {c.outside.n_syncs} | "
            f"{c.outside.n_launches} | {_top(c.inside.syncs + c.inside.uploads)}; {_top(c.outside.syncs + c.outside.uploads)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
