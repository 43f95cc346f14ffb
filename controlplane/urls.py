from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

api_v1: list[URLPattern | URLResolver] = [
    path("", include("controlplane.inventory.api.urls")),
    path("", include("controlplane.fleet.api.urls")),
    path("", include("controlplane.accounts.api.urls")),
    path("", include("controlplane.access.api.urls")),
    path("", include("controlplane.vault.api.urls")),
    path("", include("controlplane.ledger.api.urls")),
    path("", include("controlplane.reservations.api.urls")),
    path("", include("controlplane.dispatch.api.urls")),
    path("", include("controlplane.accounting.api.urls")),
    path("", include("controlplane.scheduling.api.urls")),
    path("", include("controlplane.notifications.api.urls")),
    path("", include("controlplane.templates.api.urls")),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
]

# Under /api/ Django's own error pages answer in the API's error shape; elsewhere they are Django's.
handler400 = "controlplane.core.api.errors.handler400"
handler403 = "controlplane.core.api.errors.handler403"
handler404 = "controlplane.core.api.errors.handler404"
handler500 = "controlplane.core.api.errors.handler500"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("", include("controlplane.fleet.urls")),  # /metrics, /healthz
    path("", include("controlplane.core.spa")),  # the portal: last, it answers every other path
]
