# The control plane (web, Celery worker and beat) and the node agent, in one image.
#   docker build -t gpu-control-plane .
# compose.yaml runs it; the default command is the web server.

# The portal: a static build, served by the web server (controlplane/core/spa.py).
FROM node:20-slim AS portal
WORKDIR /frontend
COPY frontend/package.json frontend/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY frontend ./
RUN npm run build

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --system --uid 10001 --create-home --home-dir /home/controlplane --shell /usr/sbin/nologin controlplane \
 && install -d -o controlplane -g controlplane /var/lib/controlplane /var/lib/nodeagent

WORKDIR /app
COPY pyproject.toml manage.py ./
COPY controlplane ./controlplane
COPY nodeagent ./nodeagent
COPY gpucp ./gpucp
RUN pip install .
COPY --from=portal /frontend/dist ./frontend/dist

USER controlplane
ENV DJANGO_SETTINGS_MODULE=controlplane.settings \
    CONTROLPLANE_VAR_DIR=/var/lib/controlplane \
    CONTROLPLANE_PRODUCTION=1
EXPOSE 8000
# The application that also serves the admin's and the portal's static files, so no proxy is required;
# put one in front for TLS.
CMD ["gunicorn", "controlplane.core.management.localwsgi:application", "--bind", "0.0.0.0:8000", \
     "--workers", "4", "--threads", "4", "--graceful-timeout", "30", "--access-logfile", "-", \
     "--limit-request-line", "0"]
