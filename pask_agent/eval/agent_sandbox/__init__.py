"""A deterministic sandbox of simulated tools (travel, shared files, a shop) over a seeded
world, the conversations generated over it, and their scorer (``eval/agent_eval.py`` runs
them). Pure Python: no model, no network, the same results in every process."""
