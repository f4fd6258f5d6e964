"""What the switch runs behind it: a model's engine (``engines.py``), put together from its server process
(``process.py``) and its rows in the keeper (``keeper.py``), by its kind's row (``kinds.py``, in the core: the config
asks it too); and what a dead front left running (``leftovers.py``). Torch-free."""
