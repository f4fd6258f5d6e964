"""``hotweights switch``: many models on one GPU behind one OpenAI-compatible port, each engine parked while
another serves (``front.py``: the port; ``switcher.py``: which engine is awake; ``engines.py``: the engine
processes; ``config.py``: the TOML file and the quick form)."""
