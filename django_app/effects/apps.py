from django.apps import AppConfig


class EffectsConfig(AppConfig):
    name = "django_app.effects"
    label = "effects"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Effects (test tasks)"
