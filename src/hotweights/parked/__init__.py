"""Parked engines (``--park-on-exit``): a start's server left parked on Ctrl-C and taken over by the next run of the
same start. ``records``: the records, take-over and retire; ``front``: the launcher in front of a server; ``watch``:
one watcher per server. Torch-free."""
