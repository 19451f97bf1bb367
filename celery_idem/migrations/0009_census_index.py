# Issue 20 (operating at 10M jobs): idem_status counted every job with a GROUP BY over
# the whole table (2.7 s at 5M rows). celery_idem.census counts the states an operator
# acts on (all but SUCCEEDED) from this index alone and estimates SUCCEEDED from the
# planner's statistics on PostgreSQL. Partial there: a finished job leaves it. MySQL and
# MariaDB have no partial indexes; the plain (state, task_name) index serves the same
# range (state <> SUCCEEDED) there. Re-runnable where DDL commits per statement.

from django.db import migrations, models

from celery_idem import schema


class Migration(migrations.Migration):

    dependencies = [
        ('celery_idem', '0008_binary_keys_on_mysql'),
    ]

    operations = [
        schema.AddIndexIfMissing(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'SUCCEEDED'), _negated=True), fields=['state', 'task_name'], name='celery_idem_job_census_idx'),
        ),
    ]
