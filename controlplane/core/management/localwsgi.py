"""The project's WSGI application, as ``runsystem`` and the compose.yaml deployment run it.

They have no web server in front, so the application serves its own static files: WhiteNoise (in MIDDLEWARE)
answers /static/ (the admin's CSS, the API docs' Swagger UI) through the finders, with no collectstatic step,
and ``controlplane.core.spa`` the built portal, precompressed. Kept as its own module so that both keep
naming one entry point whatever it wraps.
"""

from django.core.wsgi import get_wsgi_application

application = get_wsgi_application()
