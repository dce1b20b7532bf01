"""Version negotiation: the highest version both this client and the broker implement."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .errors import UnsupportedVersionError
from .schema import Api


def broker_ranges(api_versions_body: dict) -> dict[int, tuple[int, int]]:
    """Turn an ApiVersions response body into {api_key: (min, max)}."""
    return {e["api_key"]: (e["min_version"], e["max_version"]) for e in api_versions_body["api_keys"]}


def choose_version(api: Api, broker: Mapping[int, tuple[int, int]]) -> int:
    rng = broker.get(api.key)
    if rng is None:
        raise UnsupportedVersionError(f"the broker does not offer {api.name} (key {api.key})")
    lo, hi = max(api.min_version, rng[0]), min(api.max_version, rng[1])
    if lo > hi:
        raise UnsupportedVersionError(
            f"{api.name}: this client implements v{api.min_version}-v{api.max_version}, "
            f"the broker v{rng[0]}-v{rng[1]}; no common version")
    return hi


def negotiate(apis: Iterable[Api], broker: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """Versions for every API both sides support; APIs without a common version are left out."""
    chosen = {}
    for api in apis:
        try:
            chosen[api.key] = choose_version(api, broker)
        except UnsupportedVersionError:
            continue
    return chosen
