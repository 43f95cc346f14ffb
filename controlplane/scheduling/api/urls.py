from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.scheduling.api.views import ProjectFairShareView, QueuedRequestViewSet

router = SimpleRouter()
router.register("requests", QueuedRequestViewSet, basename="queued-request")

urlpatterns = [
    *router.urls,
    path("projects/<slug:slug>/fair-share/", ProjectFairShareView.as_view(), name="project-fair-share"),
]
