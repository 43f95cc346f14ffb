from django.urls import re_path
from rest_framework.routers import SimpleRouter

from controlplane.fleet.api import servers, views

router = SimpleRouter()
# Both /servers and /servers/ resolve: the documented paths have no slash, the other apps' routers add one.
router.trailing_slash = "/?"
router.register("servers", servers.ServerViewSet, basename="server")
router.register("gpus", servers.GpuViewSet, basename="gpu")
router.register("join-tokens", views.JoinTokenViewSet, basename="join-token")

urlpatterns = [
    re_path(r"^agent/enroll/?$", views.AgentEnrollView.as_view(), name="agent-enroll"),
    re_path(r"^agent/heartbeat/?$", views.AgentHeartbeatView.as_view(), name="agent-heartbeat"),
    *router.urls,
]
