"""Deterministic simulation of kdsync groups: the real ordering core over a seeded,
faulty network, with members that crash and restart keeping only what Kafka would keep.

A run is a pure function of its seed: a failing seed replays identically
(``python -m kdsync.simulation --seed N``).
"""

from kdsync.simulation.checker import Violation, check_properties
from kdsync.simulation.runner import Outcome, run_scenario
from kdsync.simulation.scenario import Scenario, make_scenario

__all__ = ["Outcome", "Scenario", "Violation", "check_properties", "make_scenario", "run_scenario"]
