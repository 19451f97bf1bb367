from django.apps import AppConfig


class EffectsConfig(AppConfig):
    name = "django_app.effects"
    label = "effects"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Effects (test tasks)"

    def ready(self) -> None:
        import django

        if django.VERSION < (5, 1):
            from django.db.backends.signals import connection_created

            connection_created.connect(_sqlite_wal, dispatch_uid="effects.sqlite_wal")


def _sqlite_wal(sender, connection, **kwargs):  # Django 4.2 has no SQLite init_command
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
