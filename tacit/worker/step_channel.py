"""How each step's StepMessage travels from the driver (rank 0) to the workers.

Spawned workers (one host) get it over a pipe each: ~50 us, and a blocking read with no
timeout, so an idle server's workers wait for hours at no cost and exit when the driver's end
closes. Workers started by torchrun (one host or many) get it by a broadcast on a gloo group of
their own whose timeout is long enough for an idle server (30 days); the driver's death closes
its sockets and the broadcast raises.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch.distributed as dist

from tacit.scheduling.scheduler_output import SchedulerOutput

_IDLE_TIMEOUT = datetime.timedelta(days=30)


@dataclass
class StepMessage:
    """What the driver sends every worker per step: sampled_* are the tokens the driver sampled
    in the previous step (the workers append them before this step's changes), None to stop."""

    scheduler_output: SchedulerOutput | None
    sampled_req_ids: list[str]
    sampled_token_ids: list[list[int]]  # per request: accepted drafts, then the sampled token
    # Not a step: every worker answers with its ModelRunner.rank_stats() in a gather to rank 0.
    collect_stats: bool = False


STOP = StepMessage(None, [], [])
COLLECT_STATS = StepMessage(None, [], [], collect_stats=True)


class PipeChannel:
    """Driver side: one pipe per spawned worker. Worker side: its own pipe."""

    def __init__(self, pipes: list[Connection]) -> None:
        self.pipes = pipes

    def send(self, msg: StepMessage) -> None:
        for pipe in self.pipes:
            pipe.send(msg)

    def recv(self) -> StepMessage:
        try:
            return self.pipes[0].recv()
        except EOFError:  # the driver is gone
            return STOP


class BroadcastChannel:
    """Every rank constructs it, in the same order relative to other group creations."""

    def __init__(self) -> None:
        self.group = dist.new_group(backend="gloo", timeout=_IDLE_TIMEOUT)

    def send(self, msg: StepMessage) -> None:
        dist.broadcast_object_list([msg], src=0, group=self.group)

    def recv(self) -> StepMessage:
        box: list = [None]
        try:
            dist.broadcast_object_list(box, src=0, group=self.group)
        except RuntimeError:  # the driver's sockets closed: it is gone
            return STOP
        return box[0]
