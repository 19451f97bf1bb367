# The schema of the first release: the job table, its history and checkpoints, the
# leases, the workers' heartbeats, and PostgreSQL's stored routines. tests/db/test_schema.py checks what it makes on
# each database against tests/db/schema/<vendor>.json.
#
# What differs per database is in celery_idem/schema.py: on PostgreSQL the job table's
# fillfactor and the task id's hash index; on MySQL/MariaDB, which have no partial
# indexes, plain ones led by the state for the reaper (the other partial indexes are not
# made there) and the identity columns compared byte for byte. The indexes are added one
# operation each, not in CreateModel's options, so each exists when the next operation
# reworks it (CreateModel defers its indexes to the end of the migration).

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

import celery_idem.fields
import celery_idem.states
from celery_idem import schema

# The hot path's statements as PL/pgSQL functions (celery_idem/backends/routines.py),
# frozen as rendered (``python -m celery_idem.backends.routines``): the backend calls a
# routine only where its name (a hash of its text) is installed. Nothing on MySQL/MariaDB
# or SQLite.
ROUTINES = {
    'celery_idem_insert_6b855d612f': (
        'CREATE OR REPLACE FUNCTION celery_idem_insert_6b855d612f(p_unflushed boolean, p_namespace text, p_key text, p_task_name text, p_args text, p_kwargs text, p_fingerprint text, p_options text, p_to_state text, p_attempt bigint, p_worker text, p_task_id text, p_lease timestamptz, p_now timestamptz, p_started_at timestamptz, p_parent bigint, p_message text, p_not_before timestamptz, p_expires_at timestamptz, p_sent_at timestamptz)\n'
        'RETURNS TABLE (won boolean, recorded boolean, id bigint, state varchar, attempt integer, fingerprint varchar, task_id varchar, lease_expires_at timestamptz, not_before timestamptz, result text, error jsonb, args jsonb, kwargs jsonb) LANGUAGE plpgsql AS $body$\n'
        '#variable_conflict use_column\n'
        'BEGIN\n'
        'IF p_unflushed THEN\n'
        "    PERFORM set_config('synchronous_commit', 'off', true);\n"
        'END IF;\n'
        'RETURN QUERY\n'
        'WITH ins AS (\n'
        '    INSERT INTO celery_idem_job (namespace, key, task_name, args, kwargs, fingerprint, options, state,\n'
        '                       attempt, worker, task_id, lease_expires_at, dispatch_count,\n'
        '                       created_at, started_at, updated_at, parent_id, message, not_before,\n'
        '                       expires_at, sent_at)\n'
        '    VALUES (p_namespace, p_key, p_task_name, p_args::jsonb, p_kwargs::jsonb,\n'
        '            p_fingerprint, p_options::jsonb, p_to_state, p_attempt, p_worker,\n'
        '            p_task_id, p_lease, 0, p_now, p_started_at, p_now, p_parent,\n'
        '            p_message::jsonb, p_not_before, p_expires_at, p_sent_at)\n'
        '    ON CONFLICT (namespace, key) DO NOTHING\n'
        '    RETURNING id, state, attempt, fingerprint, task_id, lease_expires_at, not_before, result::text AS result, error, args, kwargs\n'
        ')\n'
        'SELECT true, false, id, state, attempt, fingerprint, task_id, lease_expires_at, not_before, result::text AS result, error, args, kwargs FROM ins\n'
        'UNION ALL\n'
        'SELECT false, false, id, state, attempt, fingerprint, task_id, lease_expires_at, not_before, result::text AS result, error, args, kwargs FROM celery_idem_job\n'
        'WHERE namespace = p_namespace AND key = p_key AND NOT EXISTS (SELECT 1 FROM ins);\n'
        'END\n'
        '$body$'
    ),
    'celery_idem_claim_508745a473': (
        'CREATE OR REPLACE FUNCTION celery_idem_claim_508745a473(p_unflushed boolean, p_namespace text, p_key text, p_to_state text, p_worker text, p_task_id text, p_lease timestamptz, p_now timestamptz, p_from_state text, p_fingerprint text)\n'
        'RETURNS TABLE (won boolean, recorded boolean, id bigint, state varchar, attempt integer, fingerprint varchar, task_id varchar, lease_expires_at timestamptz, not_before timestamptz, result text, error jsonb, args jsonb, kwargs jsonb) LANGUAGE plpgsql AS $body$\n'
        '#variable_conflict use_column\n'
        'BEGIN\n'
        'IF p_unflushed THEN\n'
        "    PERFORM set_config('synchronous_commit', 'off', true);\n"
        'END IF;\n'
        'RETURN QUERY\n'
        'WITH target AS (\n'
        '    SELECT id FROM celery_idem_job WHERE namespace = p_namespace AND key = p_key\n'
        '), claimed AS (\n'
        '    UPDATE celery_idem_job\n'
        '    SET state = p_to_state, attempt = attempt + 1, worker = p_worker,\n'
        '        task_id = p_task_id, lease_expires_at = p_lease, not_before = NULL,\n'
        '        started_at = p_now, updated_at = p_now\n'
        "    WHERE id = (SELECT id FROM target) AND state || '' = p_from_state AND fingerprint = p_fingerprint AND (not_before IS NULL OR not_before <= p_now OR task_id = p_task_id)\n"
        '    RETURNING id, state, attempt, fingerprint, task_id, lease_expires_at, not_before, result::text AS result, error, args, kwargs\n'
        ')\n'
        'SELECT true, false, id, state, attempt, fingerprint, task_id, lease_expires_at, not_before, result::text AS result, error, args, kwargs FROM claimed\n'
        'UNION ALL\n'
        'SELECT false, false, id, state, attempt, fingerprint, task_id, lease_expires_at, not_before, result::text AS result, error, args, kwargs FROM celery_idem_job\n'
        'WHERE id = (SELECT id FROM target) AND NOT EXISTS (SELECT 1 FROM claimed);\n'
        'END\n'
        '$body$'
    ),
    'celery_idem_succeed_8da3b5e7cd': (
        'CREATE OR REPLACE FUNCTION celery_idem_succeed_8da3b5e7cd(p_unflushed boolean, p_to_state text, p_now timestamptz, p_v_finished_at timestamptz, p_v_lease_expires_at timestamptz, p_v_result text, p_id bigint, p_from_state text, p_attempt bigint)\n'
        'RETURNS TABLE (attempt integer) LANGUAGE plpgsql AS $body$\n'
        '#variable_conflict use_column\n'
        'BEGIN\n'
        'IF p_unflushed THEN\n'
        "    PERFORM set_config('synchronous_commit', 'off', true);\n"
        'END IF;\n'
        'RETURN QUERY\n'
        'WITH moved AS (\n'
        '    UPDATE celery_idem_job SET state = p_to_state, updated_at = p_now, finished_at = p_v_finished_at, lease_expires_at = p_v_lease_expires_at, result = p_v_result::json\n'
        '    WHERE id = p_id AND state = p_from_state AND attempt = p_attempt\n'
        '    RETURNING id, attempt\n'
        ')\n'
        'SELECT attempt FROM moved;\n'
        'END\n'
        '$body$'
    ),
    'celery_idem_succeed_final_00cbb50ebc': (
        'CREATE OR REPLACE FUNCTION celery_idem_succeed_final_00cbb50ebc(p_unflushed boolean, p_to_state text, p_now timestamptz, p_v_finished_at timestamptz, p_v_lease_expires_at timestamptz, p_v_result text, p_id bigint, p_from_state text, p_attempt bigint)\n'
        'RETURNS TABLE (checked integer) LANGUAGE plpgsql AS $body$\n'
        '#variable_conflict use_column\n'
        'BEGIN\n'
        'IF p_unflushed THEN\n'
        "    PERFORM set_config('synchronous_commit', 'off', true);\n"
        'END IF;\n'
        'RETURN QUERY\n'
        'WITH moved AS (\n'
        '    UPDATE celery_idem_job SET state = p_to_state, updated_at = p_now, finished_at = p_v_finished_at, lease_expires_at = p_v_lease_expires_at, result = p_v_result::json\n'
        '    WHERE id = p_id AND state = p_from_state AND attempt = p_attempt\n'
        '    RETURNING id, attempt\n'
        ')\n'
        'SELECT 1 / count(*)::int FROM moved;\n'
        'END\n'
        '$body$'
    ),
    'celery_idem_fail_d3820fb8d6': (
        'CREATE OR REPLACE FUNCTION celery_idem_fail_d3820fb8d6(p_unflushed boolean, p_to_state text, p_now timestamptz, p_v_error text, p_v_finished_at timestamptz, p_v_lease_expires_at timestamptz, p_id bigint, p_from_state text, p_attempt bigint, p_event text, p_worker text, p_task_id text, p_reason text, p_actor text)\n'
        'RETURNS TABLE (attempt integer) LANGUAGE plpgsql AS $body$\n'
        '#variable_conflict use_column\n'
        'BEGIN\n'
        'IF p_unflushed THEN\n'
        "    PERFORM set_config('synchronous_commit', 'off', true);\n"
        'END IF;\n'
        'RETURN QUERY\n'
        'WITH moved AS (\n'
        '    UPDATE celery_idem_job SET state = p_to_state, updated_at = p_now, error = p_v_error::jsonb, finished_at = p_v_finished_at, lease_expires_at = p_v_lease_expires_at\n'
        '    WHERE id = p_id AND state = p_from_state AND attempt = p_attempt\n'
        '    RETURNING id, attempt, started_at\n'
        ')\n'
        ', hist AS (\n'
        '    INSERT INTO celery_idem_transition (job_id, event, from_state, to_state, attempt, worker, task_id,\n'
        '                       reason, actor, at, attempt_started_at)\n'
        '    SELECT id, p_event, p_from_state, p_to_state, attempt, p_worker, p_task_id, p_reason, p_actor, p_now,\n'
        '           started_at\n'
        '    FROM moved\n'
        ')\n'
        'SELECT attempt FROM moved;\n'
        'END\n'
        '$body$'
    ),
    'celery_idem_commit_246c850196': (
        'CREATE OR REPLACE FUNCTION celery_idem_commit_246c850196(p_unflushed boolean, p_namespace text, p_key text, p_task_name text, p_args text, p_kwargs text, p_fingerprint text, p_options text, p_to_state text, p_worker text, p_task_id text, p_now timestamptz, p_v_finished_at timestamptz, p_parent bigint, p_message text, p_not_before timestamptz, p_expires_at timestamptz, p_sent_at timestamptz, p_v_result text)\n'
        'RETURNS TABLE (id bigint) LANGUAGE plpgsql AS $body$\n'
        '#variable_conflict use_column\n'
        'BEGIN\n'
        'IF p_unflushed THEN\n'
        "    PERFORM set_config('synchronous_commit', 'off', true);\n"
        'END IF;\n'
        'RETURN QUERY\n'
        'WITH ins AS (\n'
        '    INSERT INTO celery_idem_job (namespace, key, task_name, args, kwargs, fingerprint, options, state,\n'
        '                       attempt, worker, task_id, dispatch_count, created_at, started_at,\n'
        '                       updated_at, finished_at, parent_id, message, not_before,\n'
        '                       expires_at, sent_at, result)\n'
        '    VALUES (p_namespace, p_key, p_task_name, p_args::jsonb, p_kwargs::jsonb,\n'
        '            p_fingerprint, p_options::jsonb, p_to_state, 1, p_worker, p_task_id,\n'
        '            0, p_now, p_now, p_v_finished_at, p_v_finished_at, p_parent,\n'
        '            p_message::jsonb, p_not_before, p_expires_at, p_sent_at,\n'
        '            p_v_result::json)\n'
        '    ON CONFLICT (namespace, key) DO NOTHING\n'
        '    RETURNING id\n'
        ')\n'
        'SELECT id FROM ins;\n'
        'END\n'
        '$body$'
    ),
}


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for create in ROUTINES.values():
            schema_editor.execute(create, None)
    _forget()


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name in ROUTINES:
            schema_editor.execute(f"DROP FUNCTION IF EXISTS {name}", None)
    _forget()


def _forget():
    # This process's record of what is installed is stale now.
    from celery_idem.backends import routines

    routines.forget()


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
                ('state', models.CharField(choices=[('PENDING', 'Pending'), ('RUNNING', 'Running'), ('SUCCEEDED', 'Succeeded'), ('FAILED', 'Failed'), ('UNCERTAIN', 'Uncertain'), ('EXPIRED', 'Expired')], default=celery_idem.states.State['PENDING'], max_length=16, verbose_name='state')),
                ('attempt', models.PositiveIntegerField(default=0, help_text='incremented by every claim; the fencing token', verbose_name='attempt')),
                ('worker', models.CharField(blank=True, default='', max_length=255, verbose_name='worker')),
                ('task_id', models.CharField(blank=True, default='', max_length=255, verbose_name='Celery task id')),
                ('lease_expires_at', models.DateTimeField(blank=True, null=True, verbose_name='lease expires at')),
                ('not_before', models.DateTimeField(blank=True, null=True, verbose_name='not before')),
                ('dispatch_count', models.PositiveIntegerField(default=0, verbose_name='dispatches')),
                ('result', celery_idem.fields.OrderedJSONField(blank=True, null=True, verbose_name='result')),
                ('error', models.JSONField(blank=True, null=True, verbose_name='error')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='created at')),
                ('started_at', models.DateTimeField(blank=True, null=True, verbose_name='started at')),
                ('finished_at', models.DateTimeField(blank=True, null=True, verbose_name='finished at')),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='updated at')),
                ('expires_at', models.DateTimeField(blank=True, null=True, verbose_name='expires at')),
                ('message', models.JSONField(blank=True, help_text='the message as published (headers, body, routing), sent again as is', null=True, verbose_name='message')),
                ('sent_at', models.DateTimeField(blank=True, help_text='empty while an intent written in a transaction waits for its message', null=True, verbose_name='sent at')),
                ('parent', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='children', to='celery_idem.job', verbose_name='parent job')),
                ('dead_lettered', models.BooleanField(db_default=False, default=False, editable=False, help_text='FAILED because its attempts ran out, or its message could not be delivered', verbose_name='dead-lettered')),
            ],
            options={
                'verbose_name': 'idempotent job',
                'verbose_name_plural': 'idempotent jobs',
                'permissions': [('retry_job', 'Can retry a failed or uncertain job'), ('release_job', "Can release a running job's claim"), ('resolve_job', 'Can resolve an uncertain job'), ('forget_job', 'Can forget a job so its key can run again')],
                'constraints': [models.CheckConstraint(condition=models.Q(('state__in', ['PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'UNCERTAIN', 'EXPIRED'])), name='celery_idem_job_state_valid'), models.UniqueConstraint(fields=('key', 'namespace'), name='celery_idem_job_key_uniq')],
            },
        ),
        migrations.CreateModel(
            name='Checkpoint',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('step', models.CharField(max_length=200, verbose_name='step')),
                ('value', celery_idem.fields.OrderedJSONField(blank=True, null=True, verbose_name='value')),
                ('attempt', models.PositiveIntegerField(verbose_name='attempt')),
                ('at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='at')),
                ('job', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='checkpoints', to='celery_idem.job', verbose_name='job')),
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
                ('from_state', models.CharField(blank=True, choices=[('PENDING', 'Pending'), ('RUNNING', 'Running'), ('SUCCEEDED', 'Succeeded'), ('FAILED', 'Failed'), ('UNCERTAIN', 'Uncertain'), ('EXPIRED', 'Expired')], max_length=16, null=True, verbose_name='from')),
                ('to_state', models.CharField(choices=[('PENDING', 'Pending'), ('RUNNING', 'Running'), ('SUCCEEDED', 'Succeeded'), ('FAILED', 'Failed'), ('UNCERTAIN', 'Uncertain'), ('EXPIRED', 'Expired')], max_length=16, verbose_name='to')),
                ('attempt', models.PositiveIntegerField(verbose_name='attempt')),
                ('worker', models.CharField(blank=True, default='', max_length=255, verbose_name='worker')),
                ('task_id', models.CharField(blank=True, default='', max_length=255, verbose_name='Celery task id')),
                ('reason', models.TextField(blank=True, default='', verbose_name='reason')),
                ('actor', models.CharField(blank=True, default='', help_text='the user who acted, for operator actions', max_length=150, verbose_name='actor')),
                ('at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='at')),
                ('attempt_started_at', models.DateTimeField(blank=True, help_text='when the attempt this move ended had started (a take-over ends the attempt before its own)', null=True, verbose_name='attempt started at')),
                ('job', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='transitions', to='celery_idem.job', verbose_name='job')),
            ],
            options={
                'verbose_name': 'transition',
                'verbose_name_plural': 'transitions',
                'ordering': ['at', 'id'],
            },
        ),
        migrations.CreateModel(
            name='Lease',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=255, unique=True, verbose_name='name')),
                ('holder', models.CharField(max_length=255, verbose_name='holder')),
                ('token', models.BigIntegerField(default=1, help_text='grows on every acquisition and never goes back', verbose_name='fencing token')),
                ('expires_at', models.DateTimeField(verbose_name='expires at')),
                ('acquired_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='acquired at')),
                ('renewed_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='renewed at')),
                ('skipped_ticks', models.PositiveBigIntegerField(default=0, help_text='ticks other workers skipped because this lease was held', verbose_name='skipped ticks')),
                ('last_skipped_at', models.DateTimeField(blank=True, null=True, verbose_name='last skipped at')),
            ],
            options={
                'verbose_name': 'lease',
                'verbose_name_plural': 'leases',
            },
        ),
        # Worker liveness: one row per running worker, when it last proved it is alive
        # (celery_idem/liveness.py), written once per worker every
        # CELERY_IDEM_WORKER_HEARTBEAT seconds, never by a task.
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
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'RUNNING')), fields=['lease_expires_at'], name='celery_idem_job_lease_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'PENDING')), fields=['dispatch_count', 'updated_at'], name='celery_idem_job_pending_idx'),
        ),
        schema.AddPartialIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('expires_at__isnull', False), ('state', 'PENDING')), fields=['expires_at'], name='celery_idem_job_expiry_idx'),
        ),
        schema.AddPartialIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('sent_at__isnull', True), ('state', 'PENDING')), fields=['created_at'], name='celery_idem_job_unsent_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('state__in', ['FAILED', 'UNCERTAIN', 'EXPIRED'])), fields=['state', '-created_at'], name='celery_idem_job_attention_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'SUCCEEDED'), _negated=True), fields=['state', 'task_name'], name='celery_idem_job_census_idx'),
        ),
        schema.AddPartialIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('dead_lettered', True), ('state', 'FAILED')), fields=['-created_at'], name='celery_idem_job_dead_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['-created_at'], name='celery_idem_job_created_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['task_name', '-created_at'], name='celery_idem_job_task_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['task_id'], name='celery_idem_job_task_id_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('parent__isnull', False)), fields=['parent'], name='celery_idem_job_parent_idx'),
        ),
        migrations.AddIndex(
            model_name='transition',
            index=models.Index(fields=['job', 'at'], name='celery_idem_transition_job_idx'),
        ),
        # The fillfactor (PostgreSQL); the reaper's indexes led by the state (MySQL).
        migrations.RunPython(schema.lay_out_job_table, migrations.RunPython.noop,
                             atomic=False, elidable=False),
        migrations.RunPython(schema.hash_indexes, migrations.RunPython.noop, elidable=False),
        migrations.RunPython(schema.binary_key_columns, migrations.RunPython.noop,
                             atomic=False, elidable=False),
        migrations.RunPython(install, uninstall, elidable=False),
    ]
