"""Replayer: pure planning over the Arrow table -> frozen plan -> executor -> results."""

from .aggregate import build_aggregated_plan, merge_extents, split_extent
from .plan import FileIdentity, PlanChecks, PlanOp, ReplayPlan, WorkerPlan, build_posix_plan
from .replay import CHOICES, STRATEGIES, TIMINGS, ReplayReport, SizeMismatch, build_plan, plan_summaries, replay
from .results import ReplayResult

__all__ = [
    "CHOICES",
    "FileIdentity",
    "PlanChecks",
    "PlanOp",
    "ReplayPlan",
    "ReplayReport",
    "ReplayResult",
    "STRATEGIES",
    "SizeMismatch",
    "TIMINGS",
    "WorkerPlan",
    "build_aggregated_plan",
    "build_plan",
    "build_posix_plan",
    "merge_extents",
    "plan_summaries",
    "replay",
    "split_extent",
]
