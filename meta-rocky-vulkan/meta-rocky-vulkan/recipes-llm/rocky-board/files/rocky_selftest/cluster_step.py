"""The `cluster` step (a head only): prefill and decode on the served model, this board alone and
spread over the workers that answer, measured as `rocky-llm cluster bench` measures
(cluster_bench.py): whole layers per board and tensor parallelism. The report shows each and
its ratio to this board alone.

A board outside a cluster, or a worker, skips it; so does a head whose workers do not answer yet
(at first boot they are not paired: `rocky-llm cluster bench` measures it later). A head whose
workers answer but whose alone or layer-split runs fail fails it: the cluster it is configured
for does not work. A failed tensor-parallel run is shown, and the server does not use it.
"""

from __future__ import annotations

from typing import Any

from . import cluster as cl
from .bench import Deadline
from .checks import SKIP, Check, failed, passed
from .cluster_bench import bench, summary, works
from .serve_settings import DEFAULT_UBATCH
from .settings import Settings
from .terminal import say

NAME = "cluster"


def cluster(
    s: Settings, deadline: Deadline, doc: dict[str, Any], log=say
) -> tuple[Check, dict[str, Any] | None]:
    """This board alone and with its workers, or why not (a SKIP with its reason)."""
    del deadline, doc  # the bench keeps its own deadline (s.deadline_s) and the served ub
    c = cl.parse(s.cluster)
    role = c.role(s.board_name) if c is not None else None
    if role != "head":
        why = "no cluster in the config" if c is None else f"this board is a {role or 'stranger'}"
        return Check(NAME, SKIP, f"{why}: only a cluster's head measures it"), None
    try:
        data = bench(s, c, DEFAULT_UBATCH, log=log)
    except cl.ClusterError as err:
        return Check(NAME, SKIP, f"{err}; then `rocky-llm cluster bench` measures it"), None
    line = summary(data)
    if works(data):
        return passed(NAME, line), data
    return failed(NAME, line), data
