"""A warm standby for any engine whose start is mostly imports (vLLM): a process of the engine's own
Python that has imported the engine and holds no CUDA state, waiting on a private socket beside the
daemon's; a launcher hands it argv, env, cwd and stdio, it forks the server and supervises it.

Files, in import order: ``messages`` (typed messages, the protocol's codec) · ``fingerprint`` (what a
standby must share with a start, with field diffs) · ``engine`` (what an engine supplies: pre-imports,
packages, variables) · ``busy`` (a start's wait for a standby that holds its place but does not answer yet) ·
``handoff`` (the launcher's side) · ``zygote`` (the waiting process). The
engine's own part is small: ``engines/vllm/standby.py`` is vLLM's ``EngineSpec``.
"""
