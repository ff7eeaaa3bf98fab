"""Records both layers write and read: agent traces (JSONL turns for calibration), run
provenance (command, commit, machine) and the JSON Lines reader. Imports only errors, so the
runtime, calibration and eval can all depend on it without depending on each other."""
