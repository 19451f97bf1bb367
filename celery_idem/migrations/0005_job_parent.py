# The parent -> child link: the job whose claimed body sent this one (child keys).
# Depends on 0003; 0004 is another branch's, and the merge puts it in the chain.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("celery_idem", "0004_envelope_outbox_expiry"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="parent",
            field=models.ForeignKey(
                blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL,
                related_name="children", to="celery_idem.job", verbose_name="parent job",
            ),
        ),
    ]
