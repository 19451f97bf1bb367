"""A tiny shop whose payment task must charge each order exactly once."""

from .celery import app as celery_app

__all__ = ["celery_app"]
