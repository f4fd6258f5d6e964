"""A real ``hotweights serve`` with one planted fault, for tests/test_verify.py.

Usage: python fault_engine.py MODE SERVE-ARGS...
  silent_disk: ignores the weight cache (serves with --load-format auto, no evidence)
  wrong_answer: when it loads through the cache, every answer gets a prefix
"""

import sys

mode, args = sys.argv[1], sys.argv[2:]
cached = "hotweights" in args[args.index("--load-format") + 1:][:1]
if mode == "silent_disk":
    i = args.index("--load-format")
    args[i + 1] = "auto"
elif mode == "wrong_answer" and cached:
    from hotweights.serve import generate

    original = generate.Generator.stream

    def stream(self, prompt_ids, params, **kwargs):
        yield generate.Chunk("PLANTED ", None, 0)
        yield from original(self, prompt_ids, params, **kwargs)

    generate.Generator.stream = stream

from hotweights.cli import main  # noqa: E402

sys.exit(main(["serve", *args]))
