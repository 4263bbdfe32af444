"""A hub name asked of the Hugging Face Hub once, quickly, before transformers loads it.

transformers asks the hub for each file of a model with retries (``Retrying in 1s … 8s``): an
unknown name, or a machine without network and without ``HF_HUB_OFFLINE=1``, answered after
about 25 seconds with two lines. :func:`hub_check` asks one question (``model_info``, one request,
no retry, :data:`TIMEOUT` seconds) and either refuses the name at once with what to do, or lets
the load go on — from the cache only (``local_files_only=True``) where the hub cannot be reached
but the model was downloaded before.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import ModelNotFoundError

__all__ = ["TIMEOUT", "hub_check"]

#: seconds the one question to the hub may take before the hub counts as unreachable
TIMEOUT = 3.0


def _refusal(name: str, embedded: list[str], why: str, todo: str | None = None) -> ModelNotFoundError:
    """The one-line error of a name that cannot load: what it is not, why, what to do."""
    todo = todo or (
        "Pass a local folder or an embedded alias, or download the model once where the hub can be reached "
        "(HF_HUB_OFFLINE=1 then loads it from the cache without asking the hub)"
    )
    return ModelNotFoundError(
        f"could not load model {name!r}: it is not an embedded alias ({', '.join(embedded)}), not a local folder, "
        f"{why}. {todo}"
    )


def hub_check(name: str, embedded: list[str]) -> dict:
    """The extra ``from_pretrained`` keyword arguments a hub ``name`` loads with (``{}`` or
    ``{"local_files_only": True}``), or :class:`ModelNotFoundError` — a name that is no hub id, one
    the hub does not know, one neither cached nor reachable. Names of local folders and of the
    ``embedded`` models are not asked about."""
    if name in embedded or Path(name).exists():
        return {}
    from huggingface_hub import HfApi, constants, try_to_load_from_cache  # deferred: only a hub name needs it
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, HFValidationError, RepositoryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise _refusal(name, embedded, "and not a hub name (owner/name)") from None
    cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    if constants.HF_HUB_OFFLINE:
        if cached:
            return {}
        raise _refusal(
            name,
            embedded,
            "and not in the Hugging Face cache, which HF_HUB_OFFLINE=1 limits loading to",
            "Pass a local folder or an embedded alias, or unset HF_HUB_OFFLINE to download it",
        )
    try:
        HfApi().model_info(name, timeout=TIMEOUT)
    except GatedRepoError:
        return {}  # transformers says how to get access (a token, the model's terms)
    except RepositoryNotFoundError:
        if cached:
            return {"local_files_only": True}  # a private model downloaded before, without a token now
        raise _refusal(
            name, embedded, "and the Hugging Face Hub has no such model (or it is private: log in with `hf auth login`)"
        ) from None
    except HfHubHTTPError:
        return {}  # the hub answered with another error (5xx …): transformers' own load says what it is
    except Exception as err:  # noqa: BLE001 - the transport's errors (no DNS, refused, timed out) have no common base here
        if cached:
            return {"local_files_only": True}
        raise _refusal(
            name, embedded, f"not in the Hugging Face cache, and the hub cannot be reached ({type(err).__name__})"
        ) from None
    return {}
