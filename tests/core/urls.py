"""The project's URLs plus a few views that exist only to exercise the shared API machinery."""

from __future__ import annotations

from django.http import HttpResponse
from django.urls import path
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.core.errors import Conflict
from controlplane.urls import urlpatterns as project_urlpatterns

calls: list[str] = []


class EnvSerializer(serializers.Serializer):
    name = serializers.RegexField(r"^[A-Z_][A-Z0-9_]*$")
    value = serializers.CharField(allow_blank=True)


class SpecSerializer(serializers.Serializer):
    gpu_count = serializers.IntegerField(min_value=1)
    env = EnvSerializer(many=True)


class BookingSerializer(serializers.Serializer):
    spec = SpecSerializer()
    image = serializers.CharField()


class Echo(APIView):
    """Validates a nested body, then answers as ``outcome`` asks: ok, conflict or crash."""

    def post(self, request: Request) -> Response:
        calls.append(request.data.get("outcome", "ok"))
        outcome = request.data.get("outcome")
        if outcome == "conflict":
            raise Conflict(
                "GPU 3 is already booked in that window.",
                code="gpu_taken",
                fields={"spec.gpu_count": ["Not enough free GPUs."]},
                extra={"free_gpus": 2},
            )
        if outcome == "crash":
            return Response({"boom": True}, status=500)
        serializer = BookingSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return Response({"n": len(calls)}, status=201)


def agent_ping(request):  # type: ignore[no-untyped-def]
    calls.append("agent")
    return HttpResponse(str(len(calls)), status=200)


urlpatterns = [
    path("api/v1/test/echo/", Echo.as_view()),
    path("api/v1/agent/ping/", agent_ping),
    *project_urlpatterns,
]
