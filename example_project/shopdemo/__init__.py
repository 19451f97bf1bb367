"""The machinery of ``example_project/demo.py``: processes, workload, checks, report."""
