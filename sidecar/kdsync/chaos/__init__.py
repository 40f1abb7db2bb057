"""Fault campaigns: a seeded schedule of faults against a real group under load.

:mod:`kdsync.chaos.schedule` makes the schedule (pure, a function of the seed);
:mod:`kdsync.chaos.toxiproxy` runs and drives the network proxies;
:mod:`kdsync.chaos.campaign` starts brokers, proxies, sidecars and traffic, carries the
schedule out and checks the group afterwards. ``hack/chaos`` runs one from the shell.
"""
