# Issue 21 item 2: claim and commit write less WAL. They cannot be HOT updates (they change
# the state, which the partial indexes name), so each adds an entry to every index of the
# job table; on PostgreSQL the task id's index becomes a hash index, whose entries are
# smaller to log (celery_idem/schema.py, HASH_INDEXES): -130 WAL bytes per fresh task.
# Nothing changes on MySQL/MariaDB or SQLite. On PostgreSQL the index is rebuilt under a
# lock on the job table (seconds per million jobs): on a large table, migrate with
# producers and workers stopped.

from django.db import migrations

from celery_idem import schema


class Migration(migrations.Migration):

    dependencies = [
        ('celery_idem', '0011_pending_sweep_indexes'),
    ]

    operations = [
        migrations.RunPython(schema.hash_indexes, schema.btree_indexes, elidable=False),
    ]
