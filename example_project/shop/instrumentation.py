"""What the demo counts inside workers: each delivery of a shop task, and each duplicate
that met a running attempt and waits. One line per event in a file per process under
``$SHOP_DEMO_EVENTS`` (appended unbuffered: a SIGKILL loses nothing already written)."""

import os

from celery.signals import task_prerun, task_retry

from celery_idem.errors import InProgress


def _write(line: str) -> None:
    path = os.path.join(os.environ["SHOP_DEMO_EVENTS"], f"{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@task_prerun.connect
def delivered(sender=None, **_):  # type: ignore[no-untyped-def]
    if sender is not None and sender.name.startswith("shop.tasks.") \
            and sender.name != "shop.tasks.coordinate_tenant":
        _write("delivered\n")


@task_retry.connect
def waited(sender=None, reason=None, **_):  # type: ignore[no-untyped-def]
    # Celery passes the Retry; the wait's own reason is its ``exc``.
    if isinstance(getattr(reason, "exc", reason), InProgress):
        _write("waited\n")
