"""tacit tune: the best engine configuration for a workload and its SLOs (issue 38).

space: the search space, read from EngineArgs' knob marks (knob(..., tune=TuneSpec)).
"""

from tacit.tune.space import Dimension, TuneSpec, sample, search_space, suggest, validate_point

__all__ = ["Dimension", "TuneSpec", "sample", "search_space", "suggest", "validate_point"]
