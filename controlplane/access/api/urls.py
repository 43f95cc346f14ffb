from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.access.api import views
from controlplane.access.api import volumes as volume_views

router = SimpleRouter()
router.register("ssh-keys", views.SshKeyViewSet, basename="ssh-key")
router.register(r"projects/(?P<slug>[^/]+)/volumes", volume_views.VolumeViewSet, basename="project-volume")
router.register("datasets", volume_views.DatasetViewSet, basename="dataset")

urlpatterns = [
    path("projects/<str:slug>/egress/", volume_views.ProjectNetworkView.as_view(), name="project-egress"),
    *router.urls,
]
