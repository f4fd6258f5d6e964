"""The keeper: the per-user daemon that holds the cache (``hotweights daemon``).

Pure Python: no torch, no CUDA context, no GPU memory of its own. It holds pool fds and
manifests, answers requests, and owns lifecycle. One daemon per user per socket
directory, guaranteed by an ``flock`` on ``daemon.lock`` held for the daemon's life; only
the lock holder removes a stale ``daemon.sock``. Every connection is checked with
``SO_PEERCRED``: another uid is logged and closed. What one peer may cost is bounded
(``limits.Limits``): connection slots (the oldest silent connection gives way), a deadline
for each frame once it has started, frames over ``small_frame_bytes`` only with fds
(publishes) and one of them read at a time, counts per message (``key.py``,
``manifest.py``), and rate-limited warning lines. A bad request gets a typed ``error``
reply and serving goes on; a frame that cannot be re-synchronised also closes its
connection. When the fd table is full the daemon sheds connections (stalled ones
first), logs, and keeps serving: no request ends it.

Lifetime: published fds belong to the registry; attach replies carry dups that are
closed right after ``sendmsg`` (the kernel holds them in flight).

Files, in import order: ``limits`` (what one peer may cost: ``Limits``, ``Connections``,
``Warnings``) and ``registry`` (key -> entry) < ``ops`` (one decoded request -> reply)
and ``linger`` (closing with a reason), ``process`` (detach, fd limit, heap, OOM score), ``fdstore``
(a service manager's fd store), ``metrics`` (opt-in Prometheus) < ``server`` (lock, socket, the accept
and connection loops) < ``handover`` (``daemon --replace``, settings, a restart through the service
manager) < ``main`` (``hotweights daemon``: ``run``).

Not covered: remote clients (same host, same user only) and memory budgets per user
beyond ``max_bytes``.
"""
