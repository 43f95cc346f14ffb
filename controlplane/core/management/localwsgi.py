"""The project's WSGI application, serving its static files itself.

``runsystem`` and the compose.yaml deployment have no web server in front to serve the admin's CSS and the
built portal (``frontend/dist``), so this wraps the project's application in Django's static files handler,
which reads them through the finders (no collectstatic step). Behind a proxy that serves ``STATIC_ROOT``,
``controlplane.wsgi`` is enough.
"""

from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.wsgi import get_wsgi_application

application = StaticFilesHandler(get_wsgi_application())
