"""``hack/bench-replication``: kdsync against MirrorMaker 2 and the brokers' own ceiling.

One run starts local Kafka clusters once and measures, on the same brokers, each system's
sustained cross-cluster throughput, end-to-end latency at fixed offered loads (seen by one
external read_committed probe), CPU per million deliveries and peak memory per process;
then prints a table with ratios and writes JSON. See ``docs/performance.md``.

Modules: :mod:`.payload` (the benchmark's event layout), :mod:`.load` and :mod:`.probe`
(the traffic generator and the probe, each run as a child process), :mod:`.procstats`
(CPU and memory from /proc), :mod:`.systems` (kdsync groups and MirrorMaker 2 as systems
under test), :mod:`.ceiling` (ProducerPerformance / ConsumerPerformance), :mod:`.phases`
(one measured phase), :mod:`.runner` (a whole run, in ``--repeat`` rounds),
:mod:`.medians` (a figure per system over the rounds), :mod:`.report` (table and JSON),
:mod:`.profiling` (py-spy on the sidecars).

Also :mod:`.transport` (``hack/bench-transport``: the peer transport alone, TCP and RDMA
side by side).
"""
