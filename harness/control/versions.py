"""Weight-version accounting: one version per CPU cache, published by both refresh paths.

The cache keeps two pointers (RLix ``VersionedBucketCache``): *latest* (built) and
*active* (promoted, what syncs read). The version is the cache's step (RLix ``_cache_ready_step``): NeMo builds cache N+1 after
training step N (publishing N made the trajectory collector wait forever, debug #36);
ROLL uses the step itself and -1 for the base weights. Both the active refresh and the
expand sync publish the *same* value, so a version is bumped once per cache build, never
twice (the double-bump bug of independent counters), and never published before its
cache was built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


class VersionError(RuntimeError):
    pass


@dataclass
class VersionBook:
    clamp_bootstrap: bool = True  # NeMo publishes max(v, 0): bootstrap -1 becomes 0 (debug #31)
    cache_ready: Optional[int] = None  # latest built
    active: Optional[int] = None  # promoted: what syncs read and what gets published
    published: Optional[int] = None

    def cache_built(self, version: int) -> None:
        if self.cache_ready is not None and version <= self.cache_ready:
            raise VersionError(f"cache version {version} built after {self.cache_ready}: versions must increase")
        self.cache_ready = version

    def promote(self, version: int) -> None:
        if version != self.cache_ready:
            raise VersionError(f"promoting version {version} but the latest built cache is {self.cache_ready}")
        self.active = version

    def publishable(self, version: int) -> int:
        return max(version, 0) if self.clamp_bootstrap else version

    def publish(self, version: int) -> bool:
        """Record a publish; True when it is a new version (a bump), False for a re-publish."""
        if self.active is None or version != self.active:
            raise VersionError(f"publishing version {version} but the active cache is {self.active}")
        value = self.publishable(version)
        if self.published is not None and value < self.published:
            raise VersionError(f"version would go back from {self.published} to {value}")
        bumped = self.published is None or value > self.published
        self.published = value
        return bumped
