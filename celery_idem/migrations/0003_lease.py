# The lease table behind leader-owned coordinators (celery_idem.leases, LeaderTask).

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("celery_idem", "0002_job_permissions"),
    ]

    operations = [
        migrations.CreateModel(
            name="Lease",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=255, unique=True, verbose_name="name")),
                ("holder", models.CharField(max_length=255, verbose_name="holder")),
                ("token", models.BigIntegerField(default=1, help_text="grows on every acquisition and never goes back", verbose_name="fencing token")),
                ("expires_at", models.DateTimeField(verbose_name="expires at")),
                ("acquired_at", models.DateTimeField(default=django.utils.timezone.now, verbose_name="acquired at")),
                ("renewed_at", models.DateTimeField(default=django.utils.timezone.now, verbose_name="renewed at")),
                ("skipped_ticks", models.PositiveBigIntegerField(default=0, help_text="ticks other workers skipped because this lease was held", verbose_name="skipped ticks")),
                ("last_skipped_at", models.DateTimeField(blank=True, null=True, verbose_name="last skipped at")),
            ],
            options={
                "verbose_name": "lease",
                "verbose_name_plural": "leases",
            },
        ),
    ]
