from rest_framework.routers import SimpleRouter

from controlplane.scheduling.api.views import QueuedRequestViewSet

router = SimpleRouter()
router.register("requests", QueuedRequestViewSet, basename="queued-request")

urlpatterns = [*router.urls]
