from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.accounts.api import views

router = SimpleRouter()
router.register("projects", views.ProjectViewSet, basename="project")
router.register(r"projects/(?P<project_pk>\d+)/members", views.MembershipViewSet, basename="project-member")
router.register("tokens", views.ApiTokenViewSet, basename="api-token")

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path("auth/session/", views.SessionView.as_view(), name="auth-session"),
    path("auth/csrf/", views.CsrfView.as_view(), name="auth-csrf"),
    path("auth/login/", views.LoginView.as_view(), name="auth-login"),
    path("auth/logout/", views.LogoutView.as_view(), name="auth-logout"),
    *router.urls,
]
