"""Execution paths: the ways a step's forward can run over its rows (the torch reference, the
fused C++ decode step, a mixed step split between the two, two overlapping micro-batches under
tensor parallelism, data-parallel attention). Each declares which rows it accepts; the model
runner asks them in order of preference (paths/base.py: EXECUTION_PATHS) and composes them.
Importing this package registers every path."""

from tacit.worker.paths import data_parallel, fused_decode, split, torch_path, two_batch  # noqa: F401
from tacit.worker.paths.base import EXECUTION_PATHS, ExecutionPath, PathContext, PathResult

__all__ = ["EXECUTION_PATHS", "ExecutionPath", "PathContext", "PathResult"]
