"""The demo: ``python3 example_project/demo.py``.

No server to start: SQLite (WAL) and kombu's filesystem transport. It starts a real
Celery worker process, publishes each of three payments four times (as a producer that
retries, a broker that redelivers and an operator that clicks twice would), waits for
every result, and shows that each order was charged once and every caller got the answer.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "bootstrap", HERE.parent / "django_app" / "bootstrap.py")
assert _spec and _spec.loader
_bootstrap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bootstrap)

ORDERS = {1: 1250, 2: 4999, 3: 100}
COPIES = 4


def main() -> int:
    _bootstrap.ensure_venv()
    shutil.rmtree(HERE / "var", ignore_errors=True)  # a clean run every time
    sys.path.insert(0, str(HERE))
    os.environ["DJANGO_SETTINGS_MODULE"] = "shop.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from shop.models import Payment
    from shop.tasks import charge_order

    from celery_idem.models import Job, Transition

    call_command("migrate", verbosity=0)
    log = (HERE / "var" / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "shop", "worker", "-P", "prefork", "-c", "2",
         "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "INFO"],
        cwd=HERE, env={**os.environ, "PYTHONPATH": str(HERE)}, stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        print(f"worker started (pid {worker.pid}, log: {log.name})")
        print(f"publishing {len(ORDERS)} payments {COPIES} times each ...")
        started = time.monotonic()
        sent = [(order, charge_order.delay(order, cents))
                for _ in range(COPIES) for order, cents in ORDERS.items()]
        answers = [(order, result.get(timeout=180)) for order, result in sent]
        elapsed = time.monotonic() - started
    finally:
        worker.terminate()
        worker.wait(timeout=60)

    print(f"\nall {len(answers)} messages answered in {elapsed:.1f}s\n")
    print(f"{'order':>5}  {'messages':>8}  {'charges':>7}  {'answers':>30}")
    ok = True
    for order in ORDERS:
        charges = Payment.objects.filter(order_id=order).count()
        distinct = {str(a) for o, a in answers if o == order}
        ok &= charges == 1 and len(distinct) == 1
        print(f"{order:>5}  {COPIES:>8}  {charges:>7}  {', '.join(distinct):>30}")
    job = Job.objects.get(key="charge/1")
    print(f"\nhistory of {job.key} ({job.state}, attempt {job.attempt}):")
    for t in Transition.objects.filter(job=job).order_by("at", "id"):
        print(f"  {t.at:%H:%M:%S.%f}  {t.event:<16} {t.from_state or '-':>9} -> "
              f"{t.to_state:<9} attempt {t.attempt}  {t.reason}")
    print("\neach order charged exactly once" if ok else "\nDUPLICATE OR MISSING CHARGE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
