"""Many scenarios across processes, with a rate and every failing seed reported."""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from kdsync.simulation.runner import run_scenario
from kdsync.simulation.scenario import make_scenario

_CHUNK = 200


@dataclass
class CampaignResult:
    scenarios: int = 0
    events: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    by_size: dict[int, int] = field(default_factory=dict)
    by_shape: dict[str, int] = field(default_factory=dict)
    by_links: dict[str, int] = field(default_factory=dict)  # product's, or every pair

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        rate = self.scenarios / self.seconds if self.seconds else 0.0
        sizes = ", ".join(f"{n} members: {c}" for n, c in sorted(self.by_size.items()))
        shapes = ", ".join(f"{s}: {c}" for s, c in sorted(self.by_shape.items()))
        links = ", ".join(f"{s} links: {c}" for s, c in sorted(self.by_links.items()))
        lines = [
            f"{self.scenarios} scenarios ({sizes}; {shapes}; {links}), {self.events} events, "
            f"{self.seconds:.1f} s, {rate:.0f} scenarios/s, {len(self.failures)} failed"
        ]
        lines.extend(self.failures[:20])
        return "\n".join(lines)


_Tally = tuple[int, dict[int, int], dict[str, int], dict[str, int], list[str]]


def _run_chunk(first: int, count: int) -> _Tally:
    events = 0
    sizes: dict[int, int] = {}
    shapes: dict[str, int] = {}
    links: dict[str, int] = {}
    failures: list[str] = []
    for seed in range(first, first + count):
        outcome = run_scenario(make_scenario(seed))
        events += outcome.events
        size = len(outcome.scenario.group.members)
        sizes[size] = sizes.get(size, 0) + 1
        shape = outcome.scenario.shape
        shapes[shape] = shapes.get(shape, 0) + 1
        linked = "product" if outcome.scenario.product_links else "every-pair"
        links[linked] = links.get(linked, 0) + 1
        if not outcome.ok:
            failures.append(outcome.report())
    return events, sizes, shapes, links, failures


def run_campaign(
    first_seed: int, scenarios: int, workers: int | None = None, progress: bool = False
) -> CampaignResult:
    result = CampaignResult()
    started = time.monotonic()
    chunks = [
        (seed, min(_CHUNK, first_seed + scenarios - seed))
        for seed in range(first_seed, first_seed + scenarios, _CHUNK)
    ]
    with ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        for (_, count), (events, sizes, shapes, links, failures) in zip(
            chunks, pool.map(_run_chunk, *zip(*chunks, strict=True)), strict=True
        ):
            result.scenarios += count
            result.events += events
            for size, n in sizes.items():
                result.by_size[size] = result.by_size.get(size, 0) + n
            for shape, n in shapes.items():
                result.by_shape[shape] = result.by_shape.get(shape, 0) + n
            for linked, n in links.items():
                result.by_links[linked] = result.by_links.get(linked, 0) + n
            result.failures.extend(failures)
            if progress:
                elapsed = time.monotonic() - started
                print(
                    f"\r{result.scenarios}/{scenarios} scenarios, "
                    f"{result.scenarios / elapsed:.0f}/s, {len(result.failures)} failed",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
    if progress:
        print(file=sys.stderr)
    result.seconds = time.monotonic() - started
    return result
