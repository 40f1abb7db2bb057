"""Seeding a new data member's T-global from a peer (Spark)."""
