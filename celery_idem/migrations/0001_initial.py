# The job table, its transition history and checkpoints.

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models



class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='Job',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('namespace', models.CharField(max_length=200, verbose_name='namespace')),
                ('key', models.CharField(max_length=255, verbose_name='key')),
                ('task_name', models.CharField(max_length=200, verbose_name='task name')),
                ('args', models.JSONField(blank=True, null=True, verbose_name='positional arguments')),
                ('kwargs', models.JSONField(blank=True, null=True, verbose_name='keyword arguments')),
                ('fingerprint', models.CharField(help_text='SHA-256 of the canonical JSON arguments', max_length=64, verbose_name='fingerprint')),
                ('options', models.JSONField(blank=True, default=dict, help_text='queue, priority and routing used to re-dispatch the job', verbose_name='delivery options')),
                ('state', models.CharField(choices=[('PENDING', 'Pending'), ('RUNNING', 'Running'), ('SUCCEEDED', 'Succeeded'), ('FAILED', 'Failed'), ('UNCERTAIN', 'Uncertain')], default='PENDING', max_length=16, verbose_name='state')),
                ('attempt', models.PositiveIntegerField(default=0, help_text='incremented by every claim; the fencing token', verbose_name='attempt')),
                ('worker', models.CharField(blank=True, default='', max_length=255, verbose_name='worker')),
                ('task_id', models.CharField(blank=True, default='', max_length=255, verbose_name='Celery task id')),
                ('lease_expires_at', models.DateTimeField(blank=True, null=True, verbose_name='lease expires at')),
                ('not_before', models.DateTimeField(blank=True, null=True, verbose_name='not before')),
                ('dispatch_count', models.PositiveIntegerField(default=0, verbose_name='dispatches')),
                ('result', models.JSONField(blank=True, null=True, verbose_name='result')),
                ('error', models.JSONField(blank=True, null=True, verbose_name='error')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='created at')),
                ('started_at', models.DateTimeField(blank=True, null=True, verbose_name='started at')),
                ('finished_at', models.DateTimeField(blank=True, null=True, verbose_name='finished at')),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='updated at')),
            ],
            options={
                'verbose_name': 'idempotent job',
                'verbose_name_plural': 'idempotent jobs',
                'indexes': [models.Index(fields=['state', 'lease_expires_at'], name='celery_idem_job_lease_idx'), models.Index(fields=['state', 'updated_at'], name='celery_idem_job_pending_idx'), models.Index(fields=['-created_at'], name='celery_idem_job_created_idx'), models.Index(fields=['task_name', '-created_at'], name='celery_idem_job_task_idx'), models.Index(fields=['key'], name='celery_idem_job_keyprefix_idx'), models.Index(fields=['task_id'], name='celery_idem_job_task_id_idx')],
                'constraints': [models.UniqueConstraint(fields=('namespace', 'key'), name='celery_idem_job_key_uniq'), models.CheckConstraint(condition=models.Q(('state__in', ['PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'UNCERTAIN'])), name='celery_idem_job_state_valid')],
            },
        ),
        migrations.CreateModel(
            name='Checkpoint',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('step', models.CharField(max_length=200, verbose_name='step')),
                ('value', models.JSONField(blank=True, null=True, verbose_name='value')),
                ('attempt', models.PositiveIntegerField(verbose_name='attempt')),
                ('at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='at')),
                ('job', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='checkpoints', to='celery_idem.job', verbose_name='job')),
            ],
            options={
                'verbose_name': 'checkpoint',
                'verbose_name_plural': 'checkpoints',
                'constraints': [models.UniqueConstraint(fields=('job', 'step'), name='celery_idem_checkpoint_uniq')],
            },
        ),
        migrations.CreateModel(
            name='Transition',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event', models.CharField(max_length=32, verbose_name='event')),
                ('from_state', models.CharField(blank=True, choices=[('PENDING', 'Pending'), ('RUNNING', 'Running'), ('SUCCEEDED', 'Succeeded'), ('FAILED', 'Failed'), ('UNCERTAIN', 'Uncertain')], max_length=16, null=True, verbose_name='from')),
                ('to_state', models.CharField(choices=[('PENDING', 'Pending'), ('RUNNING', 'Running'), ('SUCCEEDED', 'Succeeded'), ('FAILED', 'Failed'), ('UNCERTAIN', 'Uncertain')], max_length=16, verbose_name='to')),
                ('attempt', models.PositiveIntegerField(verbose_name='attempt')),
                ('worker', models.CharField(blank=True, default='', max_length=255, verbose_name='worker')),
                ('task_id', models.CharField(blank=True, default='', max_length=255, verbose_name='Celery task id')),
                ('reason', models.TextField(blank=True, default='', verbose_name='reason')),
                ('actor', models.CharField(blank=True, default='', help_text='the user who acted, for operator actions', max_length=150, verbose_name='actor')),
                ('at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='at')),
                ('job', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='transitions', to='celery_idem.job', verbose_name='job')),
            ],
            options={
                'verbose_name': 'transition',
                'verbose_name_plural': 'transitions',
                'ordering': ['at', 'id'],
                'indexes': [models.Index(fields=['job', 'at'], name='celery_idem_transition_job_idx')],
            },
        ),
    ]
