"""Past one machine: many nodes behind one OpenAI endpoint, on Ray Serve. Each node runs its own keeper and
``hotweights switch`` front, owned by a Ray Serve replica (``node.py``); an ingress reads each request's model and
sends it through a Ray Serve request router that ranks nodes by that model's warmth on each (``router.py`` over
``warmth.py``, pure). The application: ``app.py`` (``serve run hotweights.cluster.app:app_builder config=FILE``, or
``hotweights cluster --config FILE``); its configuration: the switch's TOML with a ``[cluster]`` table
(``config.py``).

Only this package imports Ray: the keeper, the front and the engines do not (``tests/test_imports.py``). Install
with ``pip install 'hotweights[cluster]'``.
"""
