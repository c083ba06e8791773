"""The planner: (DecisionModel, observations, now) -> desired children, deletions, status, events, requeue.

Pure: no I/O and no clock of its own. The same inputs give the same plan, so a reconcile after convergence plans
exactly what exists and the apply layer writes nothing. Promotion (which versions run, where traffic goes) is
delegated to one call, `arbiter_operator.promotion.advance`.
"""

from .model import ArtifactObservation, Event, Observations, Plan, children_of
from .planner import plan
from .validate import operator_side_problems

__all__ = ["ArtifactObservation", "Event", "Observations", "Plan", "children_of", "operator_side_problems", "plan"]
