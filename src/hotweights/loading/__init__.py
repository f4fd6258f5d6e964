"""Loader side: checkpoints, digests, the block reader, preload, the pool writer, attach,
and the fallback policy. ``checkpoint`` and ``digest`` are torch-free; the rest imports torch."""
