"""Accuracy evals and serving measurements; nothing in the library imports this package.

One harness (``harness.py``: cases -> ordered concurrent runs -> scorer -> rows with
provenance -> paired statistics -> jsonl/json/md/png, resume, shard, merge; its flags in
``harness_args.py``) and one small module per workload (``bfcl_eval``, ``sql_eval``,
``structured_eval``, ``multiturn_eval``) that supplies cases, a turn runner and a scorer.
"""
