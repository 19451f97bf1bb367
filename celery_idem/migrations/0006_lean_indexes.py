# Issue 11: only the indexes a query needs, partial where the query names a state, and
# the job table laid out for HOT updates on PostgreSQL (fillfactor). The models say which
# query each index serves (celery_idem/models.py).
#
# Database-specific statements live here, and only here: the fillfactor (PostgreSQL),
# and plain indexes for databases without partial ones (MySQL/MariaDB, where Django
# skips an index with a condition).

import django.db.models.deletion
from django.db import migrations, models


#: Room left on each page of the job table: a row's next version fits beside it, so an
#: update whose indexed columns are unchanged (a heartbeat, the outbox's sent mark) is
#: HOT, and the others at least write one page. Takes effect for pages written from now
#: on (``VACUUM FULL celery_idem_job`` rewrites the existing ones, under a lock).
FILLFACTOR = 70

#: What the partial indexes become where there are none.
PLAIN_INDEXES = {
    "celery_idem_job_lease_idx": ("state", "lease_expires_at"),
    "celery_idem_job_pending_idx": ("state", "updated_at"),
    "celery_idem_job_attention_idx": ("state", "created_at"),
    "celery_idem_job_parent_idx": ("parent_id",),
}


def _table(apps):
    return apps.get_model("celery_idem", "Job")._meta.db_table


def lay_out(apps, schema_editor):
    connection = schema_editor.connection
    quote = schema_editor.quote_name
    if connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {quote(_table(apps))} SET (fillfactor = {FILLFACTOR})")
    elif not connection.features.supports_partial_indexes:
        for name, columns in PLAIN_INDEXES.items():
            schema_editor.execute(f"CREATE INDEX {quote(name)} ON {quote(_table(apps))} "
                                  f"({', '.join(quote(c) for c in columns)})")


def undo_layout(apps, schema_editor):
    connection = schema_editor.connection
    quote = schema_editor.quote_name
    if connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {quote(_table(apps))} RESET (fillfactor)")
    elif not connection.features.supports_partial_indexes:
        for name in PLAIN_INDEXES:
            schema_editor.execute(f"DROP INDEX {quote(name)} ON {quote(_table(apps))}")


class Migration(migrations.Migration):

    dependencies = [
        ('celery_idem', '0005_job_parent'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='job',
            name='celery_idem_job_lease_idx',
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='celery_idem_job_pending_idx',
        ),
        migrations.AlterField(
            model_name='checkpoint',
            name='job',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='checkpoints', to='celery_idem.job', verbose_name='job'),
        ),
        migrations.AlterField(
            model_name='job',
            name='parent',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='children', to='celery_idem.job', verbose_name='parent job'),
        ),
        migrations.AlterField(
            model_name='transition',
            name='job',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='transitions', to='celery_idem.job', verbose_name='job'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'RUNNING')), fields=['lease_expires_at'], name='celery_idem_job_lease_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'PENDING')), fields=['updated_at'], name='celery_idem_job_pending_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('state__in', ['FAILED', 'UNCERTAIN', 'EXPIRED'])), fields=['state', '-created_at'], name='celery_idem_job_attention_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('parent__isnull', False)), fields=['parent'], name='celery_idem_job_parent_idx'),
        ),
        migrations.RunPython(lay_out, undo_layout, elidable=False),
    ]
