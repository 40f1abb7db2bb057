"""``hack/bench-replication``: kdsync vs MirrorMaker 2 vs the brokers' ceiling, in one run.

Starts local Kafka clusters once (KRaft, from Maven Central's jars), measures every system
on them one after another, prints a table with ratios and writes JSON. ``--profile`` then
profiles kdsync's sidecars under sustained load with py-spy. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kdsync.benchmark.machine import describe_machine, load_average
from kdsync.benchmark.medians import result_document
from kdsync.benchmark.report import render
from kdsync.benchmark.runner import (
    KDSYNC,
    SYSTEM_KINDS,
    BenchResult,
    BenchSettings,
    result_from_json,
    run_benchmark,
)
from kdsync.benchmark.systems import MirrorMakerNotProvisioned, find_mirrormaker
from kdsync.config.sections import OrderingConfig
from kdsync.localkafka import KafkaNotProvisioned, LocalKafkaFleet, find_distribution

# Brokers tuned like Kafka's own bin/kafka-server-start.sh (1 GiB heap, G1, full JIT),
# not like the fleet's fast-start defaults for tests: the ceiling is part of what we measure.
# (No -Xms: the fleet also runs its storage tool with these options and a small heap.)
BROKER_HEAP = "1g"
BROKER_START_TIMEOUT = 600.0
BROKER_JVM_OPTIONS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)
# --quick: the smallest run that still exercises every system and phase (CI).
QUICK: dict[str, Any] = {
    "kdsync_members": (2,),
    "mm2_members": (2,),
    "ceiling_members": 2,
    "events_per_origin": 300,
    "warmup_events": 50,
    "latency_seconds": 1.0,
    "ceiling_mb": 1.0,
}


def say(text: str) -> None:
    print(f"[bench-replication {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers like 2,3,5") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive numbers like 2,3,5")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive whole number")
    return value


def _ordering(text: str) -> tuple[tuple[str, int], ...]:
    """``sourceLingerMs=20,tickMs=10``: kdsync ``ordering`` settings, checked here as the
    sidecar checks them (a typo would otherwise end in a sidecar that exits)."""
    pairs: list[tuple[str, int]] = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        key, _, value = item.partition("=")
        try:
            pairs.append((key.strip(), int(value)))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected KEY=NUMBER, e.g. sourceLingerMs=20"
            ) from None
    try:
        OrderingConfig.model_validate(dict(pairs))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid kdsync ordering section ({problems}); its settings "
            "are in docs/sidecar.md"
        ) from None
    return tuple(pairs)


def _systems(text: str) -> tuple[str, ...]:
    known = {s.lower(): s for s in (*SYSTEM_KINDS, "ceiling")}
    chosen = []
    for name in (x.strip() for x in text.split(",") if x.strip()):
        if name.lower() not in known:
            raise argparse.ArgumentTypeError(
                f"unknown system {name!r}; choose from {', '.join(known.values())}"
            )
        chosen.append(known[name.lower()])
    return tuple(chosen)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hack/bench-replication", description=__doc__)
    defaults = BenchSettings()
    parser.add_argument(
        "--members",
        type=_ints,
        default=defaults.kdsync_members,
        help="kdsync group sizes (default 2,3,5)",
    )
    parser.add_argument(
        "--mm2-members",
        type=_ints,
        default=defaults.mm2_members,
        help="clusters MirrorMaker replicates among (default 3)",
    )
    parser.add_argument(
        "--ceiling-members",
        type=int,
        default=defaults.ceiling_members,
        help="clusters the perf tools write into at once (default 3)",
    )
    parser.add_argument(
        "--sizes",
        type=_ints,
        default=defaults.sizes,
        help="event sizes in bytes (default 100,1024)",
    )
    parser.add_argument(
        "--events",
        type=int,
        default=defaults.events_per_origin,
        help="events per origin in each throughput phase (default 20000)",
    )
    parser.add_argument(
        "--warmup-events",
        type=int,
        default=defaults.warmup_events,
        help="events per origin before measuring (default 2000)",
    )
    parser.add_argument(
        "--latency-seconds",
        type=float,
        default=defaults.latency_seconds,
        help="length of each fixed-load latency phase (default 5)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=defaults.partitions,
        help="partitions of every source topic (default 3)",
    )
    parser.add_argument(
        "--ceiling-mb",
        type=float,
        default=defaults.ceiling_mb,
        help="MB the perf tools write per cluster and size (default 100)",
    )
    parser.add_argument(
        "--mm2-tasks",
        type=int,
        default=defaults.mm2_tasks,
        help="MirrorMaker tasks.max (default 1, MirrorMaker's default)",
    )
    parser.add_argument(
        "--kdsync-variant",
        type=_ordering,
        action="append",
        default=[],
        metavar="KEY=N,...",
        help="also measure kdsync with these ordering settings (over the local group's "
        "tickMs=20), in the same rounds, e.g. sourceLingerMs=20; repeatable "
        "(docs/sidecar.md)",
    )
    parser.add_argument(
        "--systems",
        type=_systems,
        default=defaults.systems,
        help="which to run (default kdsync,MM2-EOS,MM2,ceiling)",
    )
    parser.add_argument(
        "--repeat",
        type=_positive,
        default=defaults.repeat,
        metavar="N",
        help="measure every system N times, in rounds (each round every system once, "
        "in the same order); the table shows each figure's median over the rounds that "
        "delivered everything, and the spread of deliveries/s (default 1)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply events, latency phase length and ceiling size",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the smallest meaningful run (CI): 2 clusters, a few hundred events",
    )
    parser.add_argument("--output", type=Path, help="JSON result (default: in the work folder)")
    parser.add_argument("--markdown", type=Path, help="also write the tables as Markdown here")
    parser.add_argument("--work-dir", type=Path, help="where logs go (default: a new temp folder)")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="only print the tables of a saved run (and --markdown them)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="then profile kdsync's sidecars under sustained load with py-spy",
    )
    parser.add_argument(
        "--profile-only", action="store_true", help="only the py-spy profile, no comparison"
    )
    parser.add_argument("--profile-members", type=int, default=3)
    parser.add_argument("--profile-seconds", type=float, default=20.0)
    parser.add_argument("--profile-size", type=int, default=100)
    args = parser.parse_args(argv)
    if args.kdsync_variant and KDSYNC not in args.systems:
        parser.error("--kdsync-variant measures beside kdsync: add kdsync to --systems")
    return args


def settings_from(args: argparse.Namespace) -> BenchSettings:
    values = {
        "kdsync_members": args.members,
        "mm2_members": args.mm2_members,
        "ceiling_members": args.ceiling_members,
        "sizes": args.sizes,
        "events_per_origin": args.events,
        "warmup_events": args.warmup_events,
        "latency_seconds": args.latency_seconds,
        "partitions": args.partitions,
        "ceiling_mb": args.ceiling_mb,
        "mm2_tasks": args.mm2_tasks,
        "systems": args.systems,
        "repeat": args.repeat,
        "kdsync_variants": tuple(args.kdsync_variant),
    }
    if args.quick:
        values.update(QUICK)
    values["events_per_origin"] = max(10, int(values["events_per_origin"] * args.scale))
    values["latency_seconds"] = values["latency_seconds"] * args.scale
    values["ceiling_mb"] = values["ceiling_mb"] * args.scale
    if args.profile_only:
        values["systems"] = ()
    return BenchSettings(**values)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        saved = result_from_json(json.loads(args.render.read_text()))
        print(render(saved))
        if args.markdown:
            args.markdown.write_text(render(saved, markdown=True))
        return 0
    settings = settings_from(args)
    try:
        kafka = find_distribution()
        if {"MM2", "MM2-EOS"} & set(settings.systems):
            find_mirrormaker()
    except (KafkaNotProvisioned, MirrorMakerNotProvisioned) as error:
        say(f"error: {error}")
        return 2
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="kdsync-bench-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    output = args.output or work_dir / "bench-replication.json"
    clusters_needed = max(
        settings.cluster_count() if settings.systems else 0,
        args.profile_members if args.profile or args.profile_only else 0,
    )
    names = [f"c{i}" for i in range(1, clusters_needed + 1)]
    machine = describe_machine()
    say(f"work folder {work_dir}; load average {machine['loadAverageAtStart']}")
    say(f"starting {len(names)} local Kafka clusters")
    exit_code = 0
    fleet = LocalKafkaFleet(
        names,
        run_root=work_dir / "kafka",
        distribution=kafka,
        heap=BROKER_HEAP,
        jvm_options=BROKER_JVM_OPTIONS,
    )
    # Generous: formatting and starting five JVMs takes minutes on a busy two-core machine.
    fleet.start(timeout=BROKER_START_TIMEOUT)
    with fleet:
        clusters = fleet.bootstrap_servers()
        brokers = fleet.pids()
        document: dict[str, object] = {}
        command = shlex.join(["hack/bench-replication", *(argv or sys.argv[1:])])

        def save_rounds(so_far: BenchResult) -> None:
            # Rounds take minutes each: what is measured is on disk before the next starts.
            so_far.command, so_far.machine = command, machine
            try:
                output.write_text(json.dumps(result_document(so_far), indent=2))
            except OSError as exc:  # the next rounds still run; the end tries again
                say(f"could not save the rounds so far in {output}: {exc}")
                return
            say(f"the rounds so far are saved in {output}")

        if settings.systems:
            result = run_benchmark(
                settings,
                clusters,
                brokers,
                kafka,
                work_dir,
                say,
                after_round=save_rounds if settings.repeat > 1 else None,
            )
            result.command = command
            machine["loadAverageAtEnd"] = load_average()
            result.machine = machine
            print(render(result))
            if args.markdown:
                args.markdown.write_text(render(result, markdown=True))
            document = result_document(result)
            in_round = settings.repeat > 1
            failed = [
                f"{s.label}-{s.members}" + (f" (round {s.round})" if in_round else "")
                for s in result.systems
                if s.error
            ] + (["ceiling"] if result.ceiling_error else [])
            if failed:
                say(f"failed: {', '.join(failed)}")
                exit_code = 1
            if settings.repeat == 1 and len(result.measured()) > 1:
                say(
                    "one round: the systems measured first met brokers still warming up "
                    "(the brokers' CPU per delivery is several times that of later rounds, "
                    "docs/performance.md); compare systems with --repeat 3"
                )
        if args.profile or args.profile_only:
            from kdsync.benchmark.profiling import profile_kdsync  # noqa: PLC0415

            profile = profile_kdsync(
                {n: clusters[n] for n in names[: args.profile_members]},
                brokers,
                work_dir / "profile",
                event_bytes=args.profile_size,
                seconds=args.profile_seconds,
                partitions=settings.partitions,
                progress=say,
            )
            document["profile"] = profile
    output.write_text(json.dumps(document, indent=2))
    say(f"JSON: {output}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
