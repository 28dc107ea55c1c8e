"""The utilization planner: which method, H, fragments and encoding suit a model and a bandwidth.

Two models of one per-layer DAG (forward, backward, one reduction per layer, one compute resource
and one link; research/algorithms.md §2.5): an event simulation (timeline.py) and its steady state in
closed form (closed_form.py). anchors.py holds the published numbers they are checked against;
docs/planning.md states every assumption. Depends on numpy and the standard library only.
"""

from .anchors import table4
from .model import Cluster, Method, layers_for, step_time_from_flops
from .options import PlanOptions, request_from_options
from .planner import Plan, make_plan
from .render import plan_dict, render_json, render_text
from .request import PlanRequest
from .search import MODELS, bandwidth_for

__all__ = [
    "MODELS",
    "Cluster",
    "Method",
    "Plan",
    "PlanOptions",
    "PlanRequest",
    "bandwidth_for",
    "layers_for",
    "make_plan",
    "plan_dict",
    "render_json",
    "render_text",
    "request_from_options",
    "step_time_from_flops",
    "table4",
]
