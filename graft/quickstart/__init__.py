"""The quickstart (`make demo`): pinned weights, synthetic data, the recipe (quickstart.yaml)
and the end-to-end run. `python -m graft.quickstart` runs it."""
