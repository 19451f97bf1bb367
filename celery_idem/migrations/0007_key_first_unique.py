# Issue 11 (WAL per fresh task): the unique key becomes (key, namespace), so it also
# serves the admin's search by key prefix and its ordering by key, and the index of its
# own on ``key`` goes. Each write of a job row that is not a HOT update (the intent, the
# claim and the commit all change an indexed column) adds an entry to every index:
# measured with `python -m bench run wal`, one index fewer is about 290 WAL bytes per fresh
# task (docs/decisions/).
#
# The claim's lookup (namespace = %s AND key = %s) and ON CONFLICT (namespace, key) use
# either column order. The swap rebuilds the unique index: on PostgreSQL and SQLite in
# the migration's transaction, under a lock on the table for the build; MySQL/MariaDB
# commit each statement, so a key written between the drop and the create is not
# checked: run this migration with the producers and workers stopped there (a try that
# failed half-way can run again: celery_idem/schema.py's operations skip what is done).
#
# Measured and not done (same benchmark): moving the envelope out of line in TOAST
# (toast_tuple_target = 128, message STORAGE EXTERNAL). PostgreSQL only toasts a row
# wider than TOAST_TUPLE_THRESHOLD (about 2 KB, fixed at build time), whatever the
# target, so the usual ~1.3 KB row is unchanged; and a claim or commit that keeps the row
# on its page (fillfactor 70, migration 0006) already logs only the changed middle of the
# row, not the message. With a 4 KB envelope the low target toasted more columns and
# cost about 600 more bytes per task.

from django.db import migrations, models

from celery_idem import schema


class Migration(migrations.Migration):

    dependencies = [
        ('celery_idem', '0006_lean_indexes'),
    ]

    operations = [
        schema.RemoveConstraintIfPresent(
            model_name='job',
            name='celery_idem_job_key_uniq',
        ),
        schema.RemoveIndexIfPresent(
            model_name='job',
            name='celery_idem_job_keyprefix_idx',
        ),
        schema.AddConstraintIfMissing(
            model_name='job',
            constraint=models.UniqueConstraint(fields=('key', 'namespace'), name='celery_idem_job_key_uniq'),
        ),
    ]
