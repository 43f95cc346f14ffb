from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.ledger.api.views import (
    AdjustView,
    BalanceViewSet,
    GrantView,
    LedgerEntryViewSet,
    QuotaPolicyViewSet,
    RefundView,
)

router = SimpleRouter()
router.register("ledger/entries", LedgerEntryViewSet, basename="ledger-entry")
router.register("ledger/balances", BalanceViewSet, basename="ledger-balance")
router.register("ledger/quotas", QuotaPolicyViewSet, basename="ledger-quota")

urlpatterns = [
    path("ledger/grants/", GrantView.as_view(), name="ledger-grant"),
    path("ledger/adjustments/", AdjustView.as_view(), name="ledger-adjust"),
    path("ledger/refunds/", RefundView.as_view(), name="ledger-refund"),
    *router.urls,
]
