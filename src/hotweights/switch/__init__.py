"""``hotweights switch``: many models on one GPU behind one OpenAI-compatible port, each engine awake while GPU memory
allows and parked when another needs it (``front.py``: the port; ``switcher.py``: requests and the scheduler;
``schedule.py``: its decisions, pure; ``memory.py``: the GPU memory model; ``operations.py``: start, park, wake;
``actions.py``: an operator's park, stop, start and idle timeouts;
``engines.py``: the engine processes; ``config.py``: the TOML file and the quick form)."""
