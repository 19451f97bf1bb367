# Issue 20: the admin's "dead-lettered = No" filter (JobQuerySet.not_dead_lettered) is
# NOT (state = FAILED AND EXISTS a dead_lettered history row); PostgreSQL answered the
# EXISTS with a hashed subplan that read the whole history table (1.1 s at 5M jobs).
# This partial index holds only the dead_lettered rows, so the subplan reads those.
# MySQL/MariaDB have no partial indexes: there it is not made (schema.AddPartialIndex),
# the lookup per job uses celery_idem_transition_job_idx (job, at).

from django.db import migrations, models

from celery_idem import schema


class Migration(migrations.Migration):

    dependencies = [
        ('celery_idem', '0009_census_index'),
    ]

    operations = [
        schema.AddPartialIndex(
            model_name='transition',
            index=models.Index(condition=models.Q(('event', 'dead_lettered')), fields=['job'], name='celery_idem_dead_letter_idx'),
        ),
    ]
