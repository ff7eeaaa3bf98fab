"""Sample SQL data, installed as ``pask_agent.sample_data`` (see ``pask_agent/package_data.py``).

Four SQLite databases (shop, school, library, flights; built by ``build_databases.py``) and
``questions.jsonl`` ship inside the wheel from here, so ``SQLiteAssistant`` examples and the
SQL eval run from an install as from a checkout.
"""
