"""``hotweights switch``: many models on one GPU behind one OpenAI-compatible port, each engine awake while GPU
memory allows and parked when another needs it.

- the port: ``front.py`` (the app, its lifespan and run), ``handlers.py`` (its routes over ``FrontState``, the status
  page ``page.html`` among them), ``validate.py`` (a request's checks before it may switch), ``streams.py`` (each
  relayed request's log line; open streams ended when the front stops; a paused stream's relay), ``preempt.py``
  (which streams may be paused, and how each continues), ``metrics.py``;
- the scheduler: ``switcher.py``, which holds ``admission.py`` (the requests waiting and in flight) and
  ``lifecycle.py`` (start, park, wake, stop: every move through the state table of ``states.py``); ``snapshot.py``
  (the switch at one moment, frozen: what is decided over), ``schedule.py`` (its decisions over a snapshot, pure:
  the plan, the preloads' and which starts go together); ``startup.py`` (start-up: each model's preload and start in
  their own state tables, the preloads several at once where memory allows); ``actions.py`` (an operator's park,
  stop, start and idle timeouts); ``model.py`` (a model and its requests' ``Ledger``);
- memory: ``memory.py`` (the GPU memory model), ``gpus.py`` (what nvidia-smi reads), ``fit.py`` (each GPU's worst
  moment, said at start-up);
- engines: ``engines.py`` (an engine, put together from ``process.py``, the server process, ``keeper.py``, its
  keeper rows, and ``kinds.py``, what each kind needs); ``leftovers.py`` (what a dead front left running);
- ``config.py``: the TOML file and the quick form, one pydantic schema.
"""
