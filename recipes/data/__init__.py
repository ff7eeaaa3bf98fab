"""Sample SQL data, installed as ``pask_agent.sample_data`` (see ``pask_agent/package_data.py``).

Two SQLite databases and ``questions.jsonl`` ship inside the wheel from here, so
``SQLiteAssistant`` examples and the SQL eval run from an install as from a checkout.
"""
