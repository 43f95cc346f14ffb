from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.reservations.api.availability import EarliestView, FreeView, TimelineView
from controlplane.reservations.api.views import ReservationViewSet

router = SimpleRouter()
router.register("reservations", ReservationViewSet, basename="reservation")

urlpatterns = [
    path("availability/free/", FreeView.as_view(), name="availability-free"),
    path("availability/earliest/", EarliestView.as_view(), name="availability-earliest"),
    path("availability/timeline/", TimelineView.as_view(), name="availability-timeline"),
    *router.urls,
]
