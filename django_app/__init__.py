"""The Django project that celery-idem's tests, benchmarks and local development run on."""

from .celery import app as celery_app

__all__ = ["celery_app"]
