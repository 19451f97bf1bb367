"""Django's own Tasks framework (``django.tasks``, Django 6.0+) run through celery-idem:
the parts behind ``celery_idem.tasks_backend``.

``adapter`` makes each Django task a Celery task (an IdempotentTask named by the Django
task's module path) and sends Django's task signals on the worker; ``results`` reads a
job row as a ``TaskResult``; ``discovery`` says which modules the worker imports, so a
task it would not know is refused at enqueue and reported by ``manage.py check``.
Only ``celery_idem.tasks_backend`` and these import ``django.tasks``.
"""
