# The operator actions' permissions: retry, release, resolve and forget (docs/admin.md).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("celery_idem", "0001_initial"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="job",
            options={
                "permissions": [
                    ("retry_job", "Can retry a failed or uncertain job"),
                    ("release_job", "Can release a running job's claim"),
                    ("resolve_job", "Can resolve an uncertain job"),
                    ("forget_job", "Can forget a job so its key can run again"),
                ],
                "verbose_name": "idempotent job",
                "verbose_name_plural": "idempotent jobs",
            },
        ),
    ]
