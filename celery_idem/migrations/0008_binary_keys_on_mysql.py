# Issue 18: on MySQL/MariaDB the key, namespace, lease-name and step columns compare byte
# for byte. Their default collations (utf8mb4_general_ci and the like) fold case and
# ignore trailing spaces, so "Order-1" and "order-1" would be one key: the second
# publish would replay the first's result, or fail as a key mismatch, instead of running.
# The statements are in celery_idem/schema.py; other databases compare bytes already
# (PostgreSQL's deterministic collations, SQLite's BINARY), and nothing changes there.
# Outside a transaction, as DDL must be on MySQL; running it again sets the same again.

from django.db import migrations

from celery_idem import schema


class Migration(migrations.Migration):

    dependencies = [
        ('celery_idem', '0007_key_first_unique'),
    ]

    operations = [
        migrations.RunPython(schema.binary_key_columns, migrations.RunPython.noop,
                             atomic=False, elidable=False),
    ]
