from rest_framework.routers import SimpleRouter

from controlplane.inventory.api import views

router = SimpleRouter()
# Both /servers and /servers/ resolve: the documented paths have no slash, the other apps' routers add one.
router.trailing_slash = "/?"
router.register("sites", views.SiteViewSet, basename="site")
router.register("racks", views.RackViewSet, basename="rack")
router.register("gpu-models", views.GpuModelViewSet, basename="gpu-model")
# /servers and /gpus: the fleet's console (controlplane.fleet.api.servers).

urlpatterns = router.urls
