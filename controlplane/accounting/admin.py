from django.contrib import admin

from controlplane.accounting.models import GpuUsageHour, MonthlyStatement, UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ["reservation", "gpu", "project", "gpu_seconds", "credits", "cost", "currency"]
    list_filter = ["project", "gpu_model"]
    readonly_fields = [f.name for f in UsageRecord._meta.fields]


@admin.register(GpuUsageHour)
class GpuUsageHourAdmin(admin.ModelAdmin):
    list_display = ["gpu", "hour", "project", "util_mean", "held_s", "idle_s", "energy_wh"]
    list_filter = ["project"]
    date_hierarchy = "hour"


@admin.register(MonthlyStatement)
class MonthlyStatementAdmin(admin.ModelAdmin):
    list_display = ["project", "period_key", "generated_at"]
    list_filter = ["period_key"]
    readonly_fields = [f.name for f in MonthlyStatement._meta.fields]
