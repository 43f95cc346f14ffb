from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.ledger.api.views import (
    AdjustView,
    BalanceViewSet,
    BudgetAlertViewSet,
    BudgetStatusView,
    GrantView,
    LedgerEntryViewSet,
    MemberCapViewSet,
    QuotaPolicyViewSet,
    RefundView,
)

router = SimpleRouter()
router.register("ledger/entries", LedgerEntryViewSet, basename="ledger-entry")
router.register("ledger/balances", BalanceViewSet, basename="ledger-balance")
router.register("ledger/quotas", QuotaPolicyViewSet, basename="ledger-quota")
router.register("ledger/budget-alerts", BudgetAlertViewSet, basename="ledger-budget-alert")
router.register("ledger/member-caps", MemberCapViewSet, basename="ledger-member-cap")

urlpatterns = [
    path("ledger/grants/", GrantView.as_view(), name="ledger-grant"),
    path("ledger/adjustments/", AdjustView.as_view(), name="ledger-adjust"),
    path("ledger/refunds/", RefundView.as_view(), name="ledger-refund"),
    path("ledger/budgets/<slug:slug>/", BudgetStatusView.as_view(), name="ledger-budget"),
    *router.urls,
]
