# Issue 20, at 10M jobs:
# - The dead-lettered jobs are marked in the row (``dead_lettered``, written by the
#   ``dead_lettered`` move and cleared by ``reset``: states.MOVES), not found through
#   their history: the admin's dead-lettered filters and idem_status read a small partial
#   index of them instead of joining the history (0.2-0.6 s at 10M). The history's
#   dead-letter index (0010) goes. Existing rows are marked from their history: a FAILED
#   job whose last move into FAILED was ``dead_lettered``.
# - The pending index leads with the re-dispatch count, so each back-off level of the
#   lost-message sweep (recovery.due) reads only its own due range: with the whole index
#   on ``updated_at``, the jobs waiting between re-sends (100,000 after an outage) were
#   each read from the heap on every pass and by idem_status.
# MySQL/MariaDB: no partial indexes; the pending index is a plain one led by the state
# (schema.PLAIN_INDEXES), the dead-lettered index is not made (the (state, created_at)
# index of the FAILED jobs serves there).

from django.db import migrations, models

from celery_idem import schema


def mark_dead_lettered(apps, schema_editor):
    Job = apps.get_model("celery_idem", "Job")
    Transition = apps.get_model("celery_idem", "Transition")
    db = schema_editor.connection.alias
    candidates = list(Transition.objects.using(db)
                      .filter(event="dead_lettered", job__state="FAILED")
                      .values_list("job_id", flat=True).distinct())
    for start in range(0, len(candidates), 1000):
        # Each job's moves into FAILED in order, a chunk of jobs a query: the last wins.
        last = {}
        for job_id, event in (Transition.objects.using(db)
                              .filter(job_id__in=candidates[start:start + 1000],
                                      to_state="FAILED")
                              .order_by("job_id", "at", "id").values_list("job_id", "event")):
            last[job_id] = event
        marked = [job_id for job_id, event in last.items() if event == "dead_lettered"]
        Job.objects.using(db).filter(id__in=marked).update(dead_lettered=True)


class Migration(migrations.Migration):

    dependencies = [
        ('celery_idem', '0012_hash_task_id_index'),
    ]

    operations = [
        schema.RemoveIndexIfPresent(
            model_name='job',
            name='celery_idem_job_pending_idx',
        ),
        migrations.AddField(
            model_name='job',
            name='dead_lettered',
            field=models.BooleanField(db_default=False, default=False, editable=False, help_text='FAILED because its attempts ran out, or its message could not be delivered', verbose_name='dead-lettered'),
        ),
        migrations.RunPython(mark_dead_lettered, migrations.RunPython.noop, elidable=True),
        # After the marking, which reads the history's dead_lettered rows from it.
        schema.RemoveIndexIfPresent(
            model_name='transition',
            name='celery_idem_dead_letter_idx',
        ),
        schema.AddIndexIfMissing(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'PENDING')), fields=['dispatch_count', 'updated_at'], name='celery_idem_job_pending_idx'),
        ),
        migrations.RunPython(schema.plain_state_indexes, migrations.RunPython.noop,
                             atomic=False, elidable=False),
        schema.AddPartialIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('dead_lettered', True), ('state', 'FAILED')), fields=['-created_at'], name='celery_idem_job_dead_idx'),
        ),
    ]
