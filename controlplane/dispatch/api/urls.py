from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from controlplane.dispatch.api.logs import AgentLogsView, ReservationLogsView
from controlplane.dispatch.api.views import LaunchViewSet, ReservationImagesView, ReservationLaunchesView

router = SimpleRouter()
router.register("launches", LaunchViewSet, basename="launch")

urlpatterns = [
    path("reservations/<uuid:id>/launches/", ReservationLaunchesView.as_view(), name="reservation-launches"),
    path("reservations/<uuid:id>/images/", ReservationImagesView.as_view(), name="reservation-images"),
    path("reservations/<uuid:id>/logs/", ReservationLogsView.as_view(), name="reservation-logs"),
    re_path(r"^agent/logs/?$", AgentLogsView.as_view(), name="agent-logs"),
    *router.urls,
]
