from django.apps import AppConfig


class TemplatesConfig(AppConfig):
    name = "controlplane.templates"
    label = "templates"
    verbose_name = "Launch templates"

    def ready(self) -> None:
        # A booking naming a template is expanded by this app, above reservations (docs/templates.md).
        from controlplane.reservations import hooks
        from controlplane.templates.expand import expand_booking

        hooks.register_templates(expand_booking)
