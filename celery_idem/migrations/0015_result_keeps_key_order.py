# A job's result is stored as written (celery_idem.fields.OrderedJSONField): PostgreSQL's
# json type instead of jsonb, which reordered a replayed result's keys. The stored routines
# return the row's result, so they are installed again with its new type (their names, a
# hash of their text, change with it; the texts as `python -m celery_idem.backends.routines`
# printed them when this migration was written). Nothing changes on MySQL/MariaDB or SQLite.

from django.db import migrations

import celery_idem.fields

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
    'celery_idem_fail_f07420a71e': (
        'CREATE OR REPLACE FUNCTION celery_idem_fail_f07420a71e(p_unflushed boolean, p_to_state text, p_now timestamptz, p_v_error text, p_v_finished_at timestamptz, p_v_lease_expires_at timestamptz, p_id bigint, p_from_state text, p_attempt bigint, p_event text, p_worker text, p_task_id text, p_reason text, p_actor text)\n'
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
        '    RETURNING id, attempt\n'
        ')\n'
        ', hist AS (\n'
        '    INSERT INTO celery_idem_transition (job_id, event, from_state, to_state, attempt, worker, task_id,\n'
        '                       reason, actor, at)\n'
        '    SELECT id, p_event, p_from_state, p_to_state, attempt, p_worker, p_task_id, p_reason, p_actor, p_now\n'
        '    FROM moved\n'
        ')\n'
        'SELECT attempt FROM moved;\n'
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

    dependencies = [
        ('celery_idem', '0014_stored_routines'),
    ]

    operations = [
        migrations.AlterField(
            model_name='job',
            name='result',
            field=celery_idem.fields.OrderedJSONField(blank=True, null=True, verbose_name='result'),
        ),
        migrations.RunPython(install, uninstall, elidable=False),
    ]
