"""Replayer: pure planning over the Arrow table -> frozen plan -> executor -> results."""

from . import pattern
from .aggregate import build_aggregated_plan, merge_extents, split_extent
from .plan import PlanOp, ReplayPlan, WorkerPlan, build_posix_plan
from .replay import CHOICES, STRATEGIES, TIMINGS, ReplayReport, SizeMismatch, build_plan, plan_summaries, replay
from .results import ReplayResult, percentiles_ns

__all__ = [
    "CHOICES", "PlanOp", "ReplayPlan", "pattern", "ReplayReport", "ReplayResult", "STRATEGIES", "SizeMismatch", "TIMINGS",
    "WorkerPlan", "build_aggregated_plan", "build_plan", "build_posix_plan", "merge_extents", "percentiles_ns",
    "plan_summaries", "replay", "split_extent",
]
