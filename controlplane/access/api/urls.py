from rest_framework.routers import SimpleRouter

from controlplane.access.api import views

router = SimpleRouter()
router.register("ssh-keys", views.SshKeyViewSet, basename="ssh-key")

urlpatterns = router.urls
