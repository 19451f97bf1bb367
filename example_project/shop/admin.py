from django.contrib import admin

from .models import Order, Product, SentEmail, Shipment, StockDeduction, TenantReport


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "email", "sku", "quantity", "total_cents", "charge_id"]
    list_filter = ["tenant"]


@admin.register(SentEmail)
class SentEmailAdmin(admin.ModelAdmin):
    list_display = ["id", "to", "subject", "attempt", "worker", "sent_at"]
    search_fields = ["key", "subject"]


admin.site.register(Product, list_display=["sku", "quantity"])
admin.site.register(StockDeduction, list_display=["order", "sku", "quantity", "attempt"])
admin.site.register(Shipment, list_display=["order", "warehouse", "writes"])
admin.site.register(TenantReport, list_display=["tenant", "token", "holder", "paid_orders", "at"])
