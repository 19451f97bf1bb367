# Worker liveness: one row per running worker, when it last proved it is alive
# (celery_idem/liveness.py); recovery releases the claims of a worker whose row is older
# than CELERY_IDEM_WORKER_TIMEOUT (celery_idem/recovery/liveness.py). A few rows, written
# once per worker every CELERY_IDEM_WORKER_HEARTBEAT seconds, never by a task.

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('celery_idem', '0014_stored_routines'),
    ]

    operations = [
        migrations.CreateModel(
            name='WorkerHeartbeat',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('worker', models.CharField(max_length=255, unique=True, verbose_name='worker')),
                ('hostname', models.CharField(max_length=255, verbose_name='host name')),
                ('pid', models.PositiveIntegerField(default=0, verbose_name='process id')),
                ('started_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='started at')),
                ('beat_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='last beat at')),
            ],
            options={
                'verbose_name': 'worker heartbeat',
                'verbose_name_plural': 'worker heartbeats',
            },
        ),
    ]
