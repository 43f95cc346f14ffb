"""On PostgreSQL, an operator's MIG request and the server's return to ready never pass each other: either
the request is refused (the server is ready) or the return is (a request waits for its agent)."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.core.errors import Conflict
from controlplane.fleet import mig as fleet_mig
from controlplane.inventory.choices import MigChange, ServerState
from controlplane.inventory.models import Gpu, Server
from controlplane.inventory.services import server_set_state
from tests.factories import OperatorFactory
from tests.racing import together
from tests.reservations.fleet import gpu_model, server

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
ROUNDS = 12


def test_a_mig_request_and_a_return_to_ready_never_both_succeed() -> None:
    operator = OperatorFactory(username="opal")
    model = gpu_model()
    for _ in range(ROUNDS):
        srv = server(model, gpus=1, state=ServerState.MAINTENANCE)
        Gpu.objects.filter(server=srv).update(mig={"current": True, "pending": True, "devices": [], "profiles": {}})
        gpu = Gpu.objects.get(server=srv)

        def request(gpu: Gpu = gpu) -> Any:
            return fleet_mig.gpu_request_mig(gpu=gpu, enabled=True, layout=["7g.80gb"], actor=operator, reason="")

        def ready(srv: Server = srv) -> Any:
            return server_set_state(server=srv, to=ServerState.READY, actor=operator, reason="back")

        asked, returned = together(request, ready)
        assert isinstance(asked, Conflict) or isinstance(returned, Conflict), (asked, returned)
        state = Server.objects.get(pk=srv.pk).state
        change = Gpu.objects.get(pk=gpu.pk).mig_change
        # Never a ready server with a GPU waiting for its reconfiguration.
        assert not (state == ServerState.READY and change == MigChange.APPLYING)
