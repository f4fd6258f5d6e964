"""``hotweights switch``: many models on one GPU behind one OpenAI-compatible port, each engine awake while GPU
memory allows and parked when another needs it (``front.py``: the app and its run; ``handlers.py``: its routes, the
status page ``page.html`` among them; ``switcher.py``: the scheduler, which holds ``admission.py`` (the requests
waiting and in flight) and ``lifecycle.py`` (start, park, wake, stop: the moves); ``schedule.py``: its decisions,
pure; ``memory.py``: the GPU memory model; ``model.py``: a model and its requests' ``Ledger``; ``actions.py``: an
operator's park, stop, start and idle timeouts; ``engines.py`` and ``kinds.py``: the engine processes and what each
kind needs; ``leftovers.py``: what a dead front left running; ``config.py``: the TOML file and the quick form, one
pydantic schema)."""
