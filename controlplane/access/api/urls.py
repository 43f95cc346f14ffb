from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.access.api import views
from controlplane.access.api import volumes as volume_views
from controlplane.access.api import web as web_views

router = SimpleRouter()
router.register("ssh-keys", views.SshKeyViewSet, basename="ssh-key")
router.register(r"projects/(?P<slug>[^/]+)/volumes", volume_views.VolumeViewSet, basename="project-volume")
router.register("datasets", volume_views.DatasetViewSet, basename="dataset")

urlpatterns = [
    path("reservations/<uuid:id>/open/", web_views.OpenView.as_view(), name="reservation-open"),
    path("reservations/<uuid:id>/terminal/", web_views.TerminalView.as_view(), name="reservation-terminal"),
    path("projects/<str:slug>/egress/", volume_views.ProjectNetworkView.as_view(), name="project-egress"),
    *router.urls,
]
