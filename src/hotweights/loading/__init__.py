"""Engine/loader side: checkpoint reading, preload, attach. Imports torch."""
