from rest_framework.routers import SimpleRouter

from controlplane.vault.api import views

router = SimpleRouter()
router.register(r"projects/(?P<slug>[^/]+)/secrets", views.SecretViewSet, basename="project-secret")
router.register(r"projects/(?P<slug>[^/]+)/registries", views.RegistryViewSet, basename="project-registry")

urlpatterns = router.urls
