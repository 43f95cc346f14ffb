from rest_framework.routers import SimpleRouter

from controlplane.templates.api.views import TemplateViewSet

router = SimpleRouter()
router.register("templates", TemplateViewSet, basename="template")

urlpatterns = router.urls
