from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.dispatch.api.views import LaunchViewSet, ReservationLaunchesView

router = SimpleRouter()
router.register("launches", LaunchViewSet, basename="launch")

urlpatterns = [
    path("reservations/<uuid:id>/launches/", ReservationLaunchesView.as_view(), name="reservation-launches"),
    *router.urls,
]
