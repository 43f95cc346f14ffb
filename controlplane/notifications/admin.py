from django.contrib import admin

from controlplane.notifications.models import EmailMessage, Event, Notification, WebhookDelivery, WebhookEndpoint


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["id", "type", "project", "reservation", "occurred_at", "fanned_out_at"]
    list_filter = ["type"]


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ["id", "user", "title", "created_at", "read_at"]


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    list_display = ["id", "project", "url", "enabled", "disabled_at"]
    exclude = ["secret", "previous_secret"]


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ["id", "endpoint", "event", "state", "attempts", "last_status_code", "next_attempt_at"]
    list_filter = ["state"]


@admin.register(EmailMessage)
class EmailMessageAdmin(admin.ModelAdmin):
    list_display = ["id", "to_address", "subject", "state", "attempts", "sent_at"]
    list_filter = ["state"]
