"""Builders for test inputs: the synthetic v4 states benchmarks use too (``bench/states.py``)."""

from bench.states import PROVIDER, counted_state, instance, lock_info, resource, state

__all__ = ["PROVIDER", "counted_state", "instance", "lock_info", "resource", "state"]
