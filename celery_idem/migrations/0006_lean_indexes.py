# Issue 11: only the indexes a query needs, partial where the query names a state, and
# the job table laid out for HOT updates on PostgreSQL (fillfactor). The models say which
# query each index serves (celery_idem/models.py).
#
# What differs per database (the fillfactor on PostgreSQL; plain indexes led by the state
# on MySQL/MariaDB, which have no partial ones) is in celery_idem/schema.py. MySQL/MariaDB
# commit each DDL statement: a try that failed half-way left some of this behind, so the
# index operations skip what is already there and the layout runs outside a transaction
# (DDL inside one is refused there); on PostgreSQL and SQLite the migration is one
# transaction, as before.

import django.db.models.deletion
from django.db import migrations, models

from celery_idem import schema


class Migration(migrations.Migration):

    dependencies = [
        ('celery_idem', '0005_job_parent'),
    ]

    operations = [
        schema.RemoveIndexIfPresent(
            model_name='job',
            name='celery_idem_job_lease_idx',
        ),
        schema.RemoveIndexIfPresent(
            model_name='job',
            name='celery_idem_job_pending_idx',
        ),
        schema.AlterForeignKeyIndex(
            model_name='checkpoint',
            name='job',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='checkpoints', to='celery_idem.job', verbose_name='job'),
        ),
        schema.AlterForeignKeyIndex(
            model_name='job',
            name='parent',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='children', to='celery_idem.job', verbose_name='parent job'),
        ),
        schema.AlterForeignKeyIndex(
            model_name='transition',
            name='job',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='transitions', to='celery_idem.job', verbose_name='job'),
        ),
        schema.AddIndexIfMissing(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'RUNNING')), fields=['lease_expires_at'], name='celery_idem_job_lease_idx'),
        ),
        schema.AddIndexIfMissing(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'PENDING')), fields=['updated_at'], name='celery_idem_job_pending_idx'),
        ),
        schema.AddIndexIfMissing(
            model_name='job',
            index=models.Index(condition=models.Q(('state__in', ['FAILED', 'UNCERTAIN', 'EXPIRED'])), fields=['state', '-created_at'], name='celery_idem_job_attention_idx'),
        ),
        schema.AddIndexIfMissing(
            model_name='job',
            index=models.Index(condition=models.Q(('parent__isnull', False)), fields=['parent'], name='celery_idem_job_parent_idx'),
        ),
        migrations.RunPython(schema.lay_out_job_table, schema.undo_job_table_layout,
                             atomic=False, elidable=False),
    ]
