"""Data folder, installed as ``pask_agent.calibration_data`` (see ``pask_agent/package_data.py``).

Policy tables (``policies/``), dataset splits (``splits/``) and recorded traces (``traces/``)
ship inside the wheel from here; read them with ``pask_agent.package_data``.
"""
