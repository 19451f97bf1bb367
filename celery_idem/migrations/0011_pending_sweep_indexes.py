# Issue 20: the recovery pass read every PENDING job twice a pass (expired; never sent),
# each a heap fetch: ~1 s a pass with 100,000 PENDING jobs in a 10M table, with nothing
# to do. These partial indexes hold only the PENDING jobs that have an expiry, and those
# whose message never left; each sweep reads its range. (The sent-and-lost sweep reads
# the PENDING index's range on updated_at.) MySQL/MariaDB have no partial indexes: there
# they are not made (schema.AddPartialIndex); the (state, updated_at) index serves.

from django.db import migrations, models

from celery_idem import schema


class Migration(migrations.Migration):

    dependencies = [
        ('celery_idem', '0010_dead_letter_index'),
    ]

    operations = [
        schema.AddPartialIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('expires_at__isnull', False), ('state', 'PENDING')), fields=['expires_at'], name='celery_idem_job_expiry_idx'),
        ),
        schema.AddPartialIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('sent_at__isnull', True), ('state', 'PENDING')), fields=['created_at'], name='celery_idem_job_unsent_idx'),
        ),
    ]
