"""The configured providers of this process, loaded once and built lazily."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from app.settings import Settings

if TYPE_CHECKING:
    from app.providers.base import Provider
    from app.providers.registry import ProviderConfig

_lock = threading.Lock()
_configs: dict[str, dict[str, ProviderConfig]] = {}
_instances: dict[tuple[int, str], Provider] = {}


def provider_configs(settings: Settings) -> dict[str, ProviderConfig]:
    from app.providers.registry import load_providers

    key = str(settings.providers_file)
    with _lock:
        if key not in _configs:
            path = settings.providers_file if settings.providers_file.exists() else None
            _configs[key] = load_providers(path, os.environ)
        return _configs[key]


def get_provider(settings: Settings, name: str) -> Provider:
    """This process's instance of provider `name` (one per pid: never shared
    across a fork)."""
    from app.errors import ProviderMisconfigured
    from app.providers.registry import build_provider

    config = provider_configs(settings).get(name)
    if config is None:
        raise ProviderMisconfigured(f"provider {name!r} is not in the providers file")
    key = (os.getpid(), name)
    with _lock:
        if key not in _instances:
            _instances[key] = build_provider(config, os.environ)
        return _instances[key]


def provider_for(name: str) -> Provider:
    """Provider `name` of this process's settings: what a check is given."""
    from app.settings import get_settings

    return get_provider(get_settings(), name)


def pushes(settings: Settings, name: str) -> bool:
    """Whether provider `name` pushes its arrivals (the sink): its checks are
    database queries, made where the push or the sweep is, never queued
    behind a slow provider's calls. False for a provider that cannot be built."""
    try:
        return bool(getattr(get_provider(settings, name), "pushes", False))
    except Exception:
        return False
