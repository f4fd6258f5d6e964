"""``hotweights switch``: many models on one GPU behind one OpenAI-compatible port, each engine awake while GPU
memory allows and parked when another needs it.

- the core, here: ``switcher.py`` (the scheduler: the port's one door, ``door.SwitchPort``), which holds
  ``admission.py`` (the requests waiting and in flight) and ``lifecycle.py`` (start, park, wake, stop: every move
  through the state tables of ``states.py``); ``snapshot.py`` (the switch at one moment, frozen: what is decided
  over), ``schedule.py`` (its decisions over a snapshot, pure: the plan, which starts go together), ``admit.py``
  (which preload begins, pure); ``startup.py`` (each model's preload and start in their own state tables, the
  preloads several at once where memory allows); ``actions.py`` (an operator's park, stop, start and idle timeouts);
  ``model.py`` (a model, its requests' ``Ledger``, ``Changes``); ``memory.py`` (the GPU memory model), ``gpus.py``
  (what nvidia-smi reads), ``fit.py`` (each GPU's worst moment, said at start-up); ``kinds.py`` (what each engine
  kind needs: the switch's one door to vLLM); ``preempt.py`` (which streams may be paused, and how each continues);
  ``metrics.py``; ``config.py`` (the TOML file and the quick form, one pydantic schema), ``running.py`` (what a
  running front makes of one: a reload's diff);
- ``port/``: the HTTP front (``front.py``), its routes (``handlers.py``, the status page ``page.html``), a request's
  checks (``validate.py``), each answer's relay (``streams.py``);
- ``upstream/``: a model's engine (``engines.py``, from ``process.py``, the server process, and ``keeper.py``, its
  keeper rows); ``leftovers.py`` (what a dead front left running).

``metrics``, ``preempt`` and ``kinds`` stay in the core: the lifecycle counts, pauses and asks them, and a core that
imported from ``port/`` or ``upstream/`` both ways would tie the folders in a circle.
"""
