from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.notifications.api import views

router = SimpleRouter()
router.register("notifications/outbox", views.OutboxViewSet, basename="notification-outbox")
router.register("notifications", views.NotificationViewSet, basename="notification")
router.register(r"projects/(?P<project_pk>\d+)/webhooks", views.WebhookEndpointViewSet, basename="project-webhook")

urlpatterns = [
    path("notifications/preferences/", views.PreferencesView.as_view(), name="notification-preferences"),
    *router.urls,
]
