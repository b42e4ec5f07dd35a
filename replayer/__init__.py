"""Replayer: pure planning over the Arrow table -> frozen plan -> executor -> results."""

from .plan import PlanOp, ReplayPlan, WorkerPlan, build_posix_plan
from .replay import CHOICES, STRATEGIES, TIMINGS, ReplayReport, SizeMismatch, build_plan, replay
from .results import ReplayResult, percentiles_ns

__all__ = [
    "CHOICES", "PlanOp", "ReplayPlan", "ReplayReport", "ReplayResult", "STRATEGIES", "SizeMismatch", "TIMINGS",
    "WorkerPlan", "build_plan", "build_posix_plan", "percentiles_ns", "replay",
]
