"""Proof that a restart used the cache: ``observe`` (one server run) and ``verify`` (the procedure)."""
