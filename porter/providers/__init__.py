"""Providers: where candidate answers come from.

    get_provider("scripted", target, {})     replays targets/<t>/scripted/manifest.toml
    get_provider("anthropic", target, opts)  Messages API  (porter.providers.anthropic_provider)
    get_provider("openai", target, opts)     Chat Completions, also OpenAI-compatible local servers
    get_provider("reference", target, opts)  slices of the target's existing CUDA backend ([reference] in target.toml)

The name is, in order: the argument, options["provider"], $PORTER_PROVIDER,
target.toml [provider] name, "scripted".  Other packages can add providers
under the entry-point group "porter.providers" (a callable (target, options) -> Provider).
"""

from __future__ import annotations

import importlib
import os

from porter.providers.base import Completion, PromptRequest, Provider, ProviderError

__all__ = ["Completion", "PromptRequest", "Provider", "ProviderError", "get_provider", "provider_name", "send", "KNOWN"]

KNOWN = {
    "scripted": "porter.providers.scripted",
    "anthropic": "porter.providers.anthropic_provider",
    "openai": "porter.providers.openai_provider",
    "reference": "porter.providers.reference",
}


def provider_name(target, options: dict | None = None, name: str | None = None) -> str:
    options = options or {}
    toml = dict(getattr(getattr(target, "spec", None), "provider", None) or {})
    return name or options.get("provider") or os.environ.get("PORTER_PROVIDER") or toml.get("name") or "scripted"


def get_provider(name: str | None, target, options: dict | None = None) -> Provider:
    options = dict(options or {})
    name = provider_name(target, options, name)
    module = KNOWN.get(name)
    if module is None:
        from importlib.metadata import entry_points

        for ep in entry_points(group="porter.providers"):
            if ep.name == name:
                return ep.load()(target, options)
        raise ProviderError(f"unknown provider {name!r} (known: {', '.join(KNOWN)})")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ProviderError(f"provider {name} is not available: {module} cannot be imported ({exc})") from exc
    return mod.make(target, options)


def send(provider: Provider, req: PromptRequest) -> Completion:
    """The one way a prompt leaves porter, whichever the provider: not at all when it carries a secret."""
    from porter.providers.secrets import refuse_secrets

    refuse_secrets(req)
    return provider.complete(req)
