"""The operator's two waiting policies (pure), each instance named where it is used.

- `DoublingBackoff`: after n failures in a row, wait first * 2**n seconds, at most `cap` (a reconcile that raised,
  the registry archive at deletion, a namespace watch that broke).
- `ElapsedBackoff`: while waiting on something outside the operator's watches, look again after about as long as it
  has lasted, between `first` and `cap` seconds (so the looks double; a version loading, an Unknown condition).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DoublingBackoff:
    first: float
    cap: float

    def delay(self, failures: int) -> float:
        """Seconds before the next attempt after `failures` failed ones (0: the first retry)."""
        return min(self.cap, self.first * float(2 ** min(max(failures, 0), 32)))

    def schedule(self, count: int) -> list[float]:
        return [self.delay(n) for n in range(count)]


@dataclass(frozen=True)
class ElapsedBackoff:
    first: float
    cap: float

    def delay(self, elapsed: float) -> float:
        """Seconds until the next look at something that has been pending for `elapsed` seconds."""
        return min(self.cap, max(self.first, elapsed))


# A reconcile that raised (the work queue retries it): 1, 2, 4, ... 60 s.
RECONCILE_ERROR_BACKOFF = DoublingBackoff(1.0, 60.0)
# The registry archive of a deleted DecisionModel that failed: 5, 10, 20, ... at most every 5 min.
REGISTRY_ARCHIVE_BACKOFF = DoublingBackoff(5.0, 300.0)
# A namespace label watch that broke: 1, 2, 4, ... 60 s.
WATCH_RESTART_BACKOFF = DoublingBackoff(1.0, 60.0)
# The registry / S3 asked again while `Registered` or `ArtifactsValid` is Unknown: 5 s ... 60 s.
OUTSIDE_RECHECK = ElapsedBackoff(5.0, 60.0)
# A version loading (Deploying, Waiting): a safety net only, every 10 min. Whatever decides the outcome is watched and
# queues the DecisionModel when it changes: KServe's InferenceService status, the predictor Deployment's
# availability, a predictor pod's trouble (unschedulable, crash loop); the progress deadline has its own timer.
# (Starting at 60 s, the net cost a fleet of 1,000 loading for ten minutes about three passes per DecisionModel; every
# 5 min, one more pass each than the watches asked for.)
LOADING_POLL = ElapsedBackoff(600.0, 600.0)
