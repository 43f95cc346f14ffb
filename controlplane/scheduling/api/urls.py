from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.scheduling.api.views import PriorityClassViewSet, ProjectFairShareView, QueuedRequestViewSet

router = SimpleRouter()
router.register("priority-classes", PriorityClassViewSet, basename="priority-class")
router.register("requests", QueuedRequestViewSet, basename="queued-request")

urlpatterns = [
    *router.urls,
    path("projects/<slug:slug>/fair-share/", ProjectFairShareView.as_view(), name="project-fair-share"),
]
