"""Scheduling dimension: which requests run each step, in what order, and who is preempted.

Importing the package registers every scheduling policy (fcfs, priority, sjf, sla), so the
registry in policy.py is complete without lazy imports.
"""

from tacit.scheduling import policy, sla  # noqa: F401  (registration)
