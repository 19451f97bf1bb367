"""A small shop built on celery-idem (example_project/demo.py runs it under fire)."""

from .celery import app as celery_app

__all__ = ["celery_app"]
