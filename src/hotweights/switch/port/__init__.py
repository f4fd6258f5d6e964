"""The switch's port: the HTTP front (``front.py``: the app, its lifespan, ``run``), its routes (``handlers.py``,
over ``FrontState``; the status page ``page.html``), a request's checks before it may switch (``validate.py``), and
the relay of each answer (``streams.py``: its log line, open streams ended when the front stops, a paused stream's
relay). It reaches the scheduler through one door, ``door.SwitchPort``. Torch-free."""
